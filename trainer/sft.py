"""SFT with TRL's `SFTTrainer` on the round's supervised examples (corrections and references):
epochs over them within the task's time budget (and at least `sft_min_steps` optimizer steps, so
a few dozen labels still get trained on), the loss on the answer tokens only, evaluated on the
validation slice after every epoch once those steps are done; training stops when the validation
loss has not fallen for `PATIENCE` evaluations and the LoRA keeps its best evaluation's weights.

The examples are tokenized here as vLLM sees them: the rendered prompt alone, then the answer
and the end-of-turn token, so no token merges across the boundary. Each batch's common prompt
prefix (the system prompt) is run once (`trainer.shared_prefix`).
"""
from __future__ import annotations

import math

from datasets import Dataset
from transformers.trainer_callback import TrainerCallback

from common.settings import Settings
from trainer import methods
from trainer.data import SftExample
from trainer.shared_prefix import with_shared_prefix

PATIENCE = 2  # evaluations without a better validation loss before stopping


def tokenized(tokenizer, examples: list[SftExample]) -> Dataset:
    rows = []
    for example in examples:
        prompt = tokenizer(example.prompt, add_special_tokens=False)["input_ids"]
        answer = tokenizer(example.completion + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        rows.append({"input_ids": prompt + answer, "completion_mask": [0] * len(prompt) + [1] * len(answer)})
    return Dataset.from_list(rows)


class KeepBest(TrainerCallback):
    """Early stopping on the validation loss, keeping the best epoch's trainable weights in memory
    (a LoRA is small), restored once training ends."""

    def __init__(self, model, min_steps: int):
        self.model, self.min_steps = model, min_steps
        self.best_loss, self.best_state, self.bad_epochs, self.stopped = float("inf"), None, 0, False

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        loss = (metrics or {}).get("eval_loss")
        if loss is None or state.global_step < self.min_steps:
            return
        if loss < self.best_loss:
            self.best_loss, self.bad_epochs = loss, 0
            self.best_state = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        else:
            self.bad_epochs += 1
            if self.bad_epochs >= PATIENCE:
                self.stopped = control.should_training_stop = True

    def restore(self) -> None:
        if self.best_state is not None:
            params = dict(self.model.named_parameters())
            for name, value in self.best_state.items():
                params[name].data.copy_(value)


def first_useful_evaluation(min_steps: int, batch: int, examples: int) -> int:
    """The first epoch whose end has done `min_steps` steps: `KeepBest` neither stops nor keeps
    anything before them, so a validation pass there is time taken from training; on two cores a
    round's time budget often ends before `min_steps`, and then every evaluation would be of this kind."""
    return math.ceil(min_steps / math.ceil(examples / batch))


def planned_epochs(settings: Settings, examples: int) -> float:
    """Epochs over `examples`: `sft_max_epochs`, or more where those would not make `sft_min_steps` steps."""
    return max(settings.sft_max_epochs, math.ceil(settings.sft_min_steps * settings.sft_batch_size / examples))


def _trainer_class():
    from trl import SFTTrainer

    class SharedPrefixSFTTrainer(SFTTrainer):
        """TRL's SFT, each batch's common prompt prefix run once (`trainer.shared_prefix`)."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, with_shared_prefix(model, inputs), return_outputs, num_items_in_batch)

    return SharedPrefixSFTTrainer


def train(settings: Settings, model, tokenizer, examples: list[SftExample], validation: list[SftExample], budget_s: float | methods.Budget, why: str,
          progress=None) -> methods.TrainingRun:
    from trl import SFTConfig

    batch = settings.sft_batch_size
    epochs = planned_epochs(settings, len(examples))
    config = SFTConfig(**methods.trainer_args(settings, epochs, batch, len(examples)),
                       completion_only_loss=True, max_length=settings.train_max_length,
                       eval_strategy="epoch" if validation else "no", per_device_eval_batch_size=batch,
                       eval_delay=first_useful_evaluation(settings.sft_min_steps, batch, len(examples)))
    budget, metrics, best = methods.TimeBudget(budget_s), methods.StepMetrics(), KeepBest(model, settings.sft_min_steps)
    trainer = _trainer_class()(model=model, args=config, train_dataset=tokenized(tokenizer, examples),
                         eval_dataset=tokenized(tokenizer, validation) if validation else None, processing_class=tokenizer,
                         callbacks=[budget, metrics, best, methods.Progress("sft", progress)])
    outcome = methods.run(trainer, methods.TrainingRun("sft", why, len(examples)), budget, metrics)
    if best.stopped:
        outcome.stopped_by = "early stopping"
    best.restore()
    if best.best_state is not None:
        outcome.steps_log.append({"best_eval_loss": round(best.best_loss, 5)})
    return outcome
