"""`tucano bench grpo-gain`: what a round's GRPO learns from reference-free groups, and nothing
else, measured on held-out rows with their references.

This is issue 64's traffic-only question with the rest of a round taken away (traffic through the
gateway, the gate, shadow replay, promotions), so that one task's answer costs minutes, not a
`bench learn` of hours:

1. One vLLM engine (the task's model, as `serve` starts it, with runtime LoRA) samples one group
   for each of the first `--groups` train rows, as the gateway samples a served group: `n`
   completions in one request, with their logprobs, at the task's group temperature (or at each
   `--temperature` asked, each its own groups) and with its JSON schema. Each `--group-size` asked
   samples its own groups of that many completions: whether more samples a prompt put answers in
   a group that the served score can prefer, where the task's few samples hold none (SQL's).
   Each group is scored by the served score, without a reference, as traffic is. The temperature is the question for a
   greedy task: its groups must vary to carry a signal, and the gradient is taken on what was
   sampled, not on what is served greedily.
2. For each learning rate and each number of passes asked (`--lr`, `--epochs`), a fresh LoRA from
   the same seed trains on those groups with the round's own GRPO on served groups
   (`trainer.grpo.train_on_groups`: the task's training settings, no time budget). A second pass
   over a group is off the policy that sampled it: each token is weighed by its capped importance
   ratio, as a round weighs a group an older version served. Side by side, the passes say whether
   a round's few groups are worth more than one pass.
   With `--picks`, one more arm per temperature fine-tunes a fresh LoRA by the round's SFT on each
   group's served pick (`_train_on_picks`): whether what best of n picks can be taught to the
   greedy policy where GRPO's gradient on the same groups does not move it.
3. The LoRA is loaded into the engine under a fresh name, never reused, and answers the first
   `--measure-rows` test rows as the gate answers: the task's serving prompt and sampling, and
   each row's seed. The test rows are never traffic, never in the bootstrap, and never the gate's.
   Each answer is scored with the row's reference and paired with the base model's answer to the
   same row.

Reported per arm (a method, a temperature and a rate):
- steps and seconds;
- the groups' mean served score and spread, beside the served score of the base model's
  answers to the same train rows (what serving already answers there);
- groups dropped (equal rewards);
- KL to the parent, and the clip ratio;
- the held-out mean, and its paired difference from the base model, with a 95% interval;
- the reference-free difference beside it. A policy that learns to please the scorer gains there
  and not on the references.
- the served score's rank correlation with the reference score on the arm's answers;
- every component's mean;
- each held-out row's answer with its two scores (JSON only), so that two runs can be compared row
  by row.

With `--gate-rows N`, the base model and every arm also answer the first N rows of the bootstrap
eval split, the rows a round's gate draws from, and the arm's gain there is reported beside the
test rows' gain: whether a gain on the test rows shows on the rows a candidate is promoted by.
"""
from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from contextlib import ExitStack
from functools import partial
from pathlib import Path

from bench.grpo import Decoded, group_rows, sample_groups
from bench.learn import bench_engines, interval, measured, paired_gain, scorer_check, within_group_rhos
from common.datasets import load_split
from common.records import RewardContext
from common.settings import Settings
from rewards import Score
from rewards.scoring import first_best
from tasks import TASK_ENGINE, model_path_of, training_settings
from trainer import gate
from trainer.data import RolloutGroup

GRPO, PICKS = "grpo", "sft on picks"
REFERENCE_FREE_LEAD = 0.05  # issue 64: the reference-free gain exceeds the reference-scored one by at most this


async def _answers(settings: Settings, task: str, url: str, version: str | None, rows: list[gate.EvalRow]) -> tuple[list[Score], list]:
    """Each row answered by `version` (None: the base model) as the gate answers, scored with its
    reference and, beside it, without one (the served score)."""
    from router.engine_client import EnginePool

    pool = EnginePool.for_task(settings, task, [url])
    free: list = []
    try:
        scores = await gate.answer(pool, settings, task, version, rows, settings.seed, reference_free=free,
                                   free_sources=frozenset({"bench"}))
    finally:
        await pool.close()
    return scores, free


def _train(settings: Settings, task: str, groups: list[RolloutGroup], out: Path) -> dict:
    """A fresh LoRA trained on the groups (the settings' `grpo_advantage`), saved to `out`; the run's watch list."""
    from trainer import grpo, methods
    from trainer.policy import load_policy

    model, tokenizer = load_policy(model_path_of(settings, task), None, settings.lora_rank, settings.lora_alpha, "none",
                                   methods.bf16(settings), methods.checkpointing(settings), settings.seed)
    outcome = grpo.train_on_groups(settings, model, tokenizer, task, groups, float("inf"), "bench grpo-gain", policy="base")
    model.save_pretrained(out)
    report = outcome.grpo
    return {"steps": outcome.steps, "seconds": round(outcome.seconds, 1), "groups_seen": report.groups,
            "groups_dropped": report.groups_dropped, "kl_to_parent": report.kl_to_parent, "clip_ratio": report.clip_ratio,
            "reward_mean": report.reward_mean, "reward_std": report.reward_std, "entropy": report.entropy,
            "capped_tokens": [report.importance_clipped, report.importance_tokens], "groups_per_batch": report.groups_per_batch,
            "advantage": settings.grpo_advantage, "entropy_coef": settings.grpo_entropy_coef, "beta": settings.grpo_beta,
            "kl_to_base": report.kl_to_base,
            **{k: outcome.seconds_by_phase[k] for k in ("field_credit_samples", "field_credit_whole") if k in outcome.seconds_by_phase}}


def served_totals(task: str, group: RolloutGroup, samples: list[str]) -> list[float]:
    """Each sample's served score (no reference), as the groups are trained on."""
    from tasks import definition, score

    context = RewardContext.from_json(group.context, definition(task).input_model)
    return [score(task, text, None, context).total for text in samples]


def group_check(task: str, rows: list[dict], groups: list[RolloutGroup], decoded: dict[str, Decoded], served_by_key: dict[str, list[float]],
                greedy: list[Score]) -> dict:
    """How well the served score, which trains the groups, ranks their samples as the rows'
    references do (the rows are train rows: the references exist, and training never sees them).
    `greedy`: the base model's answers to the same rows as served (greedy where the task serves one
    greedy answer, the served pick where it serves the best of n), scored with the references.

    Reported: the within-group rank correlation of the served score with the reference score (the
    mean of each group's Spearman rho where both sides vary, with a 95% interval over groups): what
    GRPO's centred advantages act on; and the reference score of the samples, of the one the served
    score ranks first (what best of n serves), of the best sample, and of the answer as served."""
    from tasks import definition, score

    input_model = definition(task).input_model
    pairs, samples, picked, best = [], [], [], []
    for row, group in zip(rows, groups, strict=True):
        context = RewardContext.from_json(group.context, input_model)
        texts = decoded[group.key].samples
        with_reference = [score(task, text, row["reference"], context).total for text in texts]
        served = served_by_key[group.key]
        samples += with_reference
        picked.append(with_reference[first_best(served)])
        best.append(max(with_reference))
        pairs.append(list(zip(served, with_reference)))
    rhos = within_group_rhos(pairs)
    return {"within_group_rank_correlation": interval(rhos) if len(rhos) >= 2 else None, "groups_ranked": len(rhos),
            "samples": round(statistics.fmean(samples), 4), "served_pick": round(statistics.fmean(picked), 4),
            "best_sample": round(statistics.fmean(best), 4), "greedy": round(statistics.fmean(s.total for s in greedy), 4)}


def _batch_spread(served_by_group: list[list[float]], per_batch: int) -> float:
    """The samples' spread as GRPO's arms report it (TRL logs the std of a generation batch's
    rewards, `per_batch` groups together): the mean over consecutive batches of that std."""
    batches = [[v for served in served_by_group[i:i + per_batch] for v in served] for i in range(0, len(served_by_group), per_batch)]
    return statistics.fmean(statistics.stdev(batch) for batch in batches if len(batch) > 1)


class NothingToPick(ValueError):
    """Too few groups varied for a picks arm; the arm is reported as skipped."""


PICKS_VALIDATION_EVERY = 6  # every 6th pick is the SFT's validation slice (its early stopping), as a round holds labels apart


def _train_on_picks(settings: Settings, task: str, groups: list[RolloutGroup], decoded: dict[str, Decoded],
                    served_by_key: dict[str, list[float]], out: Path) -> dict:
    """A fresh LoRA fine-tuned with the round's SFT (the task's settings) on each group's served
    pick: the sample best of n would serve, where the group's served scores vary (a flat group
    says nothing of which is better). Rejection-sampling fine-tuning from the same groups GRPO
    trains on, without references; saved to `out`, with the same watch list where it applies."""
    from trainer import methods, sft
    from trainer.data import SftExample
    from trainer.grpo import KL_GROUPS, groups_per_batch, kl_to_parent
    from trainer.policy import load_policy

    picks, flat, served_by_group = [], 0, []
    for group in groups:
        texts, served = decoded[group.key].samples, served_by_key[group.key]
        served_by_group.append(served)
        if len(set(served)) == 1:
            flat += 1
            continue
        picks.append(SftExample(decoded[group.key].prompt, texts[first_best(served)], group.source))
    validation = picks[::PICKS_VALIDATION_EVERY]
    train = [p for i, p in enumerate(picks) if i % PICKS_VALIDATION_EVERY]
    if not train:
        raise NothingToPick(f"{len(picks)} of {len(groups)} groups varied: too few picks to train on and validate with")
    model, tokenizer = load_policy(model_path_of(settings, task), None, settings.lora_rank, settings.lora_alpha, "none",
                                   methods.bf16(settings), methods.checkpointing(settings), settings.seed)
    parent = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    outcome = sft.train(settings, model, tokenizer, train, validation, float("inf"), "bench grpo-gain: served picks")
    kl = kl_to_parent(model, parent, [(g.prompt_token_ids, g.completion_ids) for g in groups[:KL_GROUPS]], groups[0].temperature)
    model.save_pretrained(out)
    return {"steps": outcome.steps, "seconds": round(outcome.seconds, 1), "groups_seen": len(groups), "groups_dropped": flat,
            "kl_to_parent": float(f"{kl:.3g}") if kl is not None else None, "clip_ratio": None,
            "reward_mean": round(statistics.fmean(v for served in served_by_group for v in served), 5),
            "reward_std": round(_batch_spread(served_by_group, groups_per_batch(settings, len(groups))), 5),
            "entropy": None, "capped_tokens": None, "stopped_by": outcome.stopped_by, "picks": len(train), "validation": len(validation)}


def _answers_kept(rows: list[gate.EvalRow], scores: list[Score], free: list) -> list[dict]:
    """Each held-out row's answer as it was scored, with its reference and without: what a row's
    change between two arms (or two reward versions) is read from."""
    return [{"row": row.id, "output": score.output if score.output is None or isinstance(score.output, (str, dict)) else str(score.output),
             "total": round(score.total, 4), "served": None if served is None else round(served.total, 4)}
            for row, score, served in zip(rows, scores, free)]


def _free_gain(after: list, before: list) -> dict:
    return interval([a.total - b.total for a, b in zip(after, before) if a is not None and b is not None])


def run(settings: Settings, task: str, groups: int, epochs: list[float], rates: list[float], measure_rows: int, say=print,
        temperatures: list[float] | None = None, picks: bool = False, gate_rows: int = 0, sizes: list[int] | None = None,
        advantages: list[str] | None = None, entropy_coefs: list[float] | None = None, betas: list[float] | None = None) -> dict:
    """`task` is one scored with references (the command checks it before anything starts). Each
    temperature with each group size samples its own groups (default: the task's group temperature
    and `grpo_num_generations`); every rate and every number of passes (default one) trains on each,
    so the arms are every temperature and size with every rate, passes and advantage (`advantages`:
    `grpo_advantage` values, default the task's own) and entropy bonus (`entropy_coefs`: `grpo_entropy_coef`
    values, default the task's own: whether a bonus keeps the policy from collapsing onto one answer)
    and KL penalty to the base model (`betas`: `grpo_beta` values, default the task's own: whether it
    keeps the policy from writing what only the served score pays), all measured against the same
    base answers.
    `picks`: each temperature's groups also train one arm of SFT on their served picks (`_train_on_picks`).
    `gate_rows`: the first that many rows of the gate's bootstrap eval split are answered too (module docstring)."""
    from deploy.hotswap import load_everywhere, unload_everywhere
    from tasks import definition

    epochs = epochs or [1.0]
    own = training_settings(settings, task)
    rates = rates or [own.grpo_learning_rate]
    temperatures = temperatures or [definition(task).group_temperature]
    sizes = sizes or [own.grpo_num_generations]
    advantages = advantages or [own.grpo_advantage]
    entropy_coefs = entropy_coefs or [own.grpo_entropy_coef]
    betas = betas or [own.grpo_beta]
    rows = [gate.EvalRow.of(task, row, "bench") for row in load_split(settings.datasets_dir, task, "test")[:measure_rows]]
    if len(rows) < 3:
        raise ValueError(f"{task}'s test split has {len(rows)} rows; at least 3 are needed for an interval")
    gated = gate.bootstrap_rows(settings, task)[:gate_rows]
    if gate_rows and len(gated) < 3:
        raise ValueError(f"{task}'s eval split has {len(gated)} rows; at least 3 are needed for an interval")
    started = time.perf_counter()
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tucano-grpo-gain-")))
        kind = TASK_ENGINE[task]
        url = bench_engines(own, scratch, stack, say, (kind,))[kind][0][0]
        base, base_free = asyncio.run(_answers(own, task, url, None, rows))
        say(f"{task} base model: {statistics.fmean(s.total for s in base):.3f} on {len(rows)} held-out rows")
        base_gated = asyncio.run(_answers(own, task, url, None, gated))[0] if gated else []
        if gated:
            say(f"{task} base model: {statistics.fmean(s.total for s in base_gated):.3f} on {len(gated)} of the gate's rows")
        # the groups' own rows answered as served (greedy, or the pick of n): what a group's samples are worse or better than
        train_rows = group_rows(settings, task, groups)
        rows_of_groups = [gate.EvalRow.of(task, row, "bench") for row in train_rows]
        greedy, greedy_free = asyncio.run(_answers(own, task, url, None, rows_of_groups))
        served = [s.total for s in greedy_free if s is not None]
        greedy_served = round(statistics.fmean(served), 4) if served else None
        say(f"{task} base model's answers as served to the groups' {len(rows_of_groups)} train rows: served score {greedy_served}")
        arms, checks, skipped = [], [], []

        def measure(method: str, temperature: float, size: int, rate: float, passes: float | None, train) -> None:
            """One arm: a fresh LoRA trained by `train(out)`, loaded under a fresh name (vLLM keeps a
            reused name's cached blocks), measured on the held-out rows, unloaded."""
            version = f"{task}-gain-{uuid.uuid4().hex[:8]}"
            trained = train(scratch / version)
            asyncio.run(load_everywhere([url], version, str(scratch / version)))
            try:
                scores, free = asyncio.run(_answers(own, task, url, version, rows))
                on_gate_rows = asyncio.run(_answers(own, task, url, version, gated))[0] if gated else []
            finally:
                asyncio.run(unload_everywhere([url], version))
            arm = {"method": method, "temperature": temperature, "group_size": size, "learning_rate": rate, "epochs": passes, **trained,
                   "held_out": measured(scores),
                   "gain": paired_gain(scores, base), "reference_free_gain": _free_gain(free, base_free),
                   "scorer": scorer_check(free, scores),
                   "gain_on_gate_rows": paired_gain(on_gate_rows, base_gated) if gated else None,
                   "same_answer_as_base": sum(1 for a, b in zip(scores, base) if a.output is not None and a.output == b.output),
                   "answers": _answers_kept(rows, scores, free)}
            arms.append(arm)
            passes_said = "" if passes is None else f", {passes:g} pass(es)"
            say(f"{task}, {_method(arm)} at temperature {temperature:g}, {size} samples a group, rate {rate:g}{passes_said}: "
                f"{trained['steps']} steps in {trained['seconds']} s, "
                f"held-out {arm['held_out']['mean']:.3f}, gain {arm['gain']['mean']:+.3f} {arm['gain']['ci95']}")

        for temperature, size in [(t, n) for t in temperatures for n in sizes]:
            sized = own.model_copy(update={"grpo_num_generations": size})
            decoded: dict[str, Decoded] = {}
            sampled = asyncio.run(sample_groups(sized, task, url, groups, temperature, decoded))
            served_by_key = {group.key: served_totals(task, group, decoded[group.key].samples) for group in sampled}
            checked = group_check(task, train_rows, sampled, decoded, served_by_key, greedy)
            checks.append({"temperature": temperature, "group_size": size, **checked})
            say(f"{task}: sampled {len(sampled)} groups of {size} at temperature {temperature:g} without references; "
                f"with their rows' references: samples {checked['samples']:.3f}, the served score's pick {checked['served_pick']:.3f}, "
                f"best sample {checked['best_sample']:.3f}, as served {checked['greedy']:.3f}")
            for rate, passes, advantage, coef, beta in [(r, p, a, e, b) for r in rates for p in epochs for a in advantages
                                                        for e in entropy_coefs for b in betas]:
                arm_settings = sized.model_copy(update={"grpo_learning_rate": rate, "grpo_max_epochs": passes, "grpo_advantage": advantage,
                                                        "grpo_entropy_coef": coef, "grpo_beta": beta})
                measure(GRPO, temperature, size, rate, passes, partial(_train, arm_settings, task, sampled))
            if picks:
                try:
                    measure(PICKS, temperature, size, own.train_learning_rate, None,
                            partial(_train_on_picks, sized, task, sampled, decoded, served_by_key))
                except NothingToPick as reason:
                    skipped.append(f"{PICKS} at temperature {temperature:g}, {size} samples a group: {reason}")
                    say(f"{task}: skipped {skipped[-1]}")
    return {"task": task, "groups": groups, "group_sizes": sizes, "epochs": epochs, "advantages": advantages, "entropy_coefs": entropy_coefs,
            "betas": betas,
            "temperatures": temperatures, "measure_rows": len(rows), "gate_rows": len(gated),
            "base_on_gate_rows": measured(base_gated) if gated else None, "greedy_served_on_group_rows": greedy_served,
            "base": {"held_out": measured(base), "scorer": scorer_check(base_free, base), "answers": _answers_kept(rows, base, base_free)},
            "groups_check": checks, "arms": arms, "skipped": skipped, "minutes": round((time.perf_counter() - started) / 60, 1)}


def _epochs(results: dict) -> list[float]:
    """The passes a run's arms trained: a list since passes became arms; one number in older results."""
    epochs = results["epochs"]
    return [float(epochs)] if isinstance(epochs, (int, float)) else [float(e) for e in epochs]


def _sizes(results: dict) -> list[int]:
    """The samples a group of a run's arms: a list since group sizes became arms; one number in older results."""
    return list(results["group_sizes"]) if "group_sizes" in results else [int(results["group_size"])]


def _size(entry: dict, results: dict) -> int:
    """The samples a group of one arm or one groups' check; older results name one size for all."""
    return entry.get("group_size", _sizes(results)[0])


def _passes(arm: dict, results: dict) -> str:
    """An arm's passes over the groups as the table shows them: older results name them once for
    every GRPO arm; an SFT arm's epochs are its early stopping's, not a setting (-)."""
    passes = arm["epochs"] if "epochs" in arm else _epochs(results)[0] if arm.get("method", GRPO) == GRPO else None
    return "-" if passes is None else format(passes, "g")


def _method(arm: dict) -> str:
    """An arm's method as the table names it: GRPO with its advantages where they are not the sum
    (older results name none: the sum), its entropy bonus and its KL penalty where it has them (older
    results: none)."""
    method, advantage, coef = arm.get("method", GRPO), arm.get("advantage", "sum"), arm.get("entropy_coef") or 0.0
    beta = arm.get("beta") or 0.0
    if method != GRPO:
        return method
    said = [advantage] * (advantage != "sum") + [f"entropy {coef:g}"] * (coef > 0) + [f"KL to base {beta:g}"] * (beta > 0)
    return f"{method} ({', '.join(said)})" if said else method


def _signed(difference: dict) -> str:
    """A paired difference with its 95% interval, signed: +0.067 [+0.027, +0.115]."""
    low, high = difference["ci95"]
    return f"{difference['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"


def table(results: dict) -> str:
    base = results["base"]
    rho = (base["scorer"] or {}).get("rank_correlation")
    served = (base["scorer"] or {}).get("served_mean")
    lines = [f"Trained on {results['groups']} reference-free groups of {results['task']} ({' or '.join(map(str, _sizes(results)))} samples each, "
             f"passes over them: {', '.join(f'{e:g}' for e in _epochs(results))}), "
             f"measured on {results['measure_rows']} held-out test rows with their references; "
             f"the base model: {base['held_out']['mean']:.3f}, its served score there {served}, their rank correlation {rho}. "
             f"Its answers as served to the groups' own rows: served score {results['greedy_served_on_group_rows']}.", "",
             "| method | temperature | samples a group | learning rate | passes | steps (s) | groups a batch | groups dropped / seen | "
             "group served score (spread) | KL to the parent | clip ratio | "
             "held-out mean | gain [95%] | reference-free gain | rank correlation | answers as the base model's |",
             "|---|---:|---:|---:|---:|---|---:|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for arm in results["arms"]:
        gain, free = arm["gain"], arm["reference_free_gain"]
        lead = free["mean"] - gain["mean"]
        flag = f" (ahead by {lead:.3f})" if lead > REFERENCE_FREE_LEAD else ""
        clip = "-" if arm["clip_ratio"] is None else f"{arm['clip_ratio']:.3f}"
        lines.append(f"| {_method(arm)} | {arm['temperature']:g} | {_size(arm, results)} | {arm['learning_rate']:g} | "
                     f"{_passes(arm, results)} | {arm['steps']} ({arm['seconds']:.0f}) | {arm.get('groups_per_batch') or '-'} | "
                     f"{arm['groups_dropped']} / {arm['groups_seen']} | {arm['reward_mean']:.3f} ({arm['reward_std']:.3f}) | "
                     f"{arm['kl_to_parent']} | {clip} | {arm['held_out']['mean']:.3f} | "
                     f"{_signed(gain)} | {free['mean']:+.3f}{flag} | "
                     f"{(arm['scorer'] or {}).get('rank_correlation')} | {arm['same_answer_as_base']} of {results['measure_rows']} |")
    lines += [f"\nSkipped: {reason}." for reason in results.get("skipped", [])]
    if results.get("gate_rows"):
        lines += ["", f"On the first {results['gate_rows']} rows of the gate's eval split (the base model: "
                  f"{results['base_on_gate_rows']['mean']:.3f}), beside the test rows:", "",
                  "| method | temperature | samples a group | learning rate | passes | gain on the test rows [95%] | gain on the gate's rows [95%] |",
                  "|---|---:|---:|---:|---:|---|---|"]
        for arm in results["arms"]:
            gain, gated = arm["gain"], arm["gain_on_gate_rows"]
            lines.append(f"| {_method(arm)} | {arm['temperature']:g} | {_size(arm, results)} | "
                         f"{arm['learning_rate']:g} | {_passes(arm, results)} | "
                         f"{_signed(gain)} | {_signed(gated)} |")
    lines += ["", "The groups' train rows scored with their references (never trained on): the served score's rank "
              "correlation within each group, and the reference score of the samples, of the sample it ranks first, "
              "of the best sample and of the base model's answer as served:", "",
              "| temperature | samples a group | within-group rank correlation [95%] (groups) | samples | served score's pick | best sample | as served |",
              "|---:|---:|---|---:|---:|---:|---:|"]
    for check in results.get("groups_check", []):
        rho = check["within_group_rank_correlation"]
        shown = f"{rho['mean']:.2f} [{rho['ci95'][0]:.2f}, {rho['ci95'][1]:.2f}]" if rho else "-"
        lines.append(f"| {check['temperature']:g} | {_size(check, results)} | {shown} ({check['groups_ranked']}) | "
                     f"{check['samples']:.3f} | "
                     f"{check['served_pick']:.3f} | {check['best_sample']:.3f} | {check['greedy']:.3f} |")
    lines.append(f"\nTook {results['minutes']} minutes.")
    return "\n".join(lines)
