"""Everything that touches TRL's private API, in one place, for the one TRL version it was
written and measured against (`WRITTEN_FOR`).

TRL's private names change between releases without notice; code that reaches them quietly
does the wrong thing on another version. So `check_version()` runs first, and a round on any
other TRL fails at once with a message that says which version is installed and which is
expected, instead of training with a patch that no longer fits.

The reaches, and why none has a public equivalent:
- `project_labelled_positions_only()`: TRL's fused LM head (`trl.trainer.utils._use_triton`)
  projects only labelled positions on Triton devices and every position elsewhere. On a CPU
  nothing is compiled, and a task prompt is mostly context (the SQL prompt: about 480 tokens of
  schema before a 30-token answer), so projecting every position made the LM head about 70% of
  an SFT step here. The labelled rows alone give the same loss and gradients
  (`tests/unit/test_training_on_cpu.py`).
- `base_as_reference()`: TRL 1.16 takes a PEFT model's KL reference from a copy of the adapter it
  starts with (an adapter named "ref"), with no option for the base model; the trainers below
  delete that copy, so TRL falls back to the adapters switched off.
- `group_dropping_grpo_trainer()`: a `GRPOTrainer` whose `_generate_and_score_completions` drops
  groups whose rewards did not vary from the loss (their tokens would dilute the others'), and
  counts them per group in `_metrics`; TRL's own `frac_reward_zero_std` is batch-wide and drops
  nothing. With a `field_credit` set it hands TRL's loss per-token advantages (B, T), which TRL
  1.16's `_compute_loss` takes as they are (`trainer.field_credit`). Its `_get_per_token_logps_and_entropies` runs each distinct prompt of a batch once
  (`trainer.shared_prefix.with_shared_prompts`): TRL runs every sample's prompt again, and a
  group's samples share theirs whole.
- `served_groups_grpo_trainer()`: the same, for rollouts that a `rollout_func` hands back with the
  logprobs they were sampled with (the served groups). TRL applies its truncated importance
  sampling against those logprobs only when `use_vllm` is set, and `use_vllm` at construction
  also starts TRL's own vLLM client; so the flag is set after construction, with a weight sync
  that does nothing (a served group was sampled already: no weights go anywhere). It also counts
  the tokens whose ratio the cap cut.
"""
from __future__ import annotations

import torch
import trl
import trl.trainer.utils

from trainer.shared_prefix import with_shared_prompts

WRITTEN_FOR = "1.16"  # major.minor of TRL whose private API this module reaches


class TrlVersionError(RuntimeError):
    pass


def check_version(installed: str | None = None) -> None:
    installed = installed or trl.__version__
    if ".".join(installed.split(".")[:2]) != WRITTEN_FOR:
        raise TrlVersionError(
            f"TRL {installed} is installed, but trainer/trl_internals.py reaches TRL {WRITTEN_FOR}.x's private API "
            f"(`trl.trainer.utils._use_triton`, `GRPOTrainer._generate_and_score_completions`, `GRPOTrainer._metrics`, "
            "`GRPOTrainer.use_vllm`, `GRPOTrainer.vllm_generation`); "
            f"install trl=={WRITTEN_FOR}.* (as pyproject.toml pins it), or re-check those names against TRL {installed} "
            "and update the module")


def project_labelled_positions_only() -> None:
    """Patch TRL's fused LM head to project only labelled positions on a CPU too; applied once."""
    check_version()
    uses_triton = trl.trainer.utils._use_triton
    if getattr(uses_triton, "tucano", False):
        return

    def compact(device: torch.device) -> bool:
        return device.type == "cpu" or uses_triton(device)

    compact.tucano = True
    trl.trainer.utils._use_triton = compact


# The largest advantage a group whose rewards are all equal still carries: TRL centres them in
# float32, whose mean of eight 0.15s misses 0.15 by one unit in the last place (1.5e-8), so an exact
# test kept such groups (run 58: SQL's 30 groups all at 0.15, none dropped). A real difference is far
# larger: totals are rounded to 4 places, so a group that varies has an advantage of at least 1e-4/n.
FLAT_ADVANTAGE = 1e-6


def flat_groups(advantages: torch.Tensor, generations: int) -> torch.Tensor:
    """Which groups (of `generations` consecutive samples) carry no signal: every advantage within
    float32's error of centring equal rewards."""
    return advantages.view(-1, generations).abs().amax(dim=1) <= FLAT_ADVANTAGE


REFERENCE_ADAPTER = "ref"  # the adapter TRL 1.16 copies a PEFT model's weights into, as its KL reference


def base_as_reference(model) -> None:
    """Make the KL penalty's reference the base model (adapters off) instead of TRL's copy of the
    weights the run starts from: with `beta` above 0 and a PEFT model, TRL 1.16 adds an adapter
    named "ref" holding that copy, and computes the reference with it where it exists and with
    the adapters disabled where not. Deleting it leaves the second. It would also be saved beside
    the trained adapter (`save_pretrained` writes every adapter)."""
    if REFERENCE_ADAPTER in getattr(model, "peft_config", {}):
        model.delete_adapter(REFERENCE_ADAPTER)


def group_dropping_grpo_trainer() -> type:
    """TRL's `GRPOTrainer` with zero-variance groups dropped from the loss and counted."""
    check_version()
    from trl import GRPOTrainer

    class GroupDroppingGRPOTrainer(GRPOTrainer):
        dropped_groups = 0
        seen_groups = 0
        flat_batches_in_a_row = 0  # generation batches in a row with every group flat (`NoSignalLeft`)

        field_credit = None  # a trainer.field_credit.FieldCredit: per-field token advantages (aggregation `fields`)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            base_as_reference(self.model)

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            generations = self.num_generations
            flat = flat_groups(output["advantages"], generations)
            if self.field_credit is not None:  # TRL's loss takes (B, T) advantages as they are
                output["advantages"] = self.field_credit.token_advantages(
                    output["advantages"], output["completion_ids"], output["completion_mask"], self.processing_class, generations)
            self.seen_groups += int(flat.numel())
            self.dropped_groups += int(flat.sum())
            self.flat_batches_in_a_row = self.flat_batches_in_a_row + 1 if bool(flat.all()) else 0
            if flat.any():
                keep = (~flat).repeat_interleave(generations).unsqueeze(1).to(output["completion_mask"].dtype)
                output["completion_mask"] = output["completion_mask"] * keep
                output["num_items_in_batch"] = self.accelerator.gather(output["completion_mask"].sum()).sum()
            self._metrics["train"]["zero_variance_groups_dropped"].append(float(flat.float().mean()))
            return output

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                               compute_entropy=False, compute_aux_loss=False, **multimodal):
            """TRL's, with each distinct prompt of a chunk run once; a chunk whose prompts do not
            repeat, a multimodal batch or an MoE's aux loss take TRL's own forward."""
            if compute_aux_loss or any(value is not None for value in multimodal.values()):
                return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, batch_size,
                                                                  compute_entropy, compute_aux_loss, **multimodal)
            batch_size = batch_size or input_ids.size(0)
            logps, entropies = [], []
            for start in range(0, input_ids.size(0), batch_size):
                ids, mask = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
                inputs = with_shared_prompts(model, ids, mask, logits_to_keep)
                if inputs is None:
                    chunk_logps, chunk_entropies, _ = super()._get_per_token_logps_and_entropies(
                        model, ids, mask, logits_to_keep, compute_entropy=compute_entropy)
                else:
                    with self.accelerator.autocast():
                        outputs = model(**inputs, fused_lm_head=True)
                    chunk_logps = outputs.log_probs[:, -logits_to_keep:]
                    chunk_entropies = outputs.entropy[:, -logits_to_keep:] if compute_entropy else None
                logps.append(chunk_logps)
                entropies.append(chunk_entropies)
            return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    return GroupDroppingGRPOTrainer


class _SampledAlready:
    """TRL's weight sync for a rollout function's vLLM, when the rollouts were served before the
    round: nothing to send."""

    def sync_weights(self) -> None:
        pass


def served_groups_grpo_trainer() -> type:
    """`group_dropping_grpo_trainer`'s class with TRL's importance sampling against the logprobs
    the rollout function returns (`token_truncate` at the config's `vllm_importance_sampling_clip_max`).
    Counts: `importance_tokens` (in the loss) and `importance_clipped` (above the cap)."""
    check_version()
    base = group_dropping_grpo_trainer()

    class ServedGroupsGRPOTrainer(base):
        importance_tokens = 0
        importance_clipped = 0

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.rollout_func is None or not self.vllm_importance_sampling_correction:
                raise ValueError("served groups train with a rollout_func and vllm_importance_sampling_correction")
            self.use_vllm, self.vllm_mode, self.vllm_generation = True, "server", _SampledAlready()
            self._last_loaded_step = 0

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            mask = output["completion_mask"].bool()
            log_ratio = (output["old_per_token_logps"] - output["sampling_per_token_logps"]).nan_to_num(0.0)
            cap = self.vllm_importance_sampling_clip_max
            self.importance_tokens += int(mask.sum())
            self.importance_clipped += int(((log_ratio.exp() > cap) & mask).sum())
            return output

    return ServedGroupsGRPOTrainer
