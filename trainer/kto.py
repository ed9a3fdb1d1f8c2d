"""KTO with TRL's `KTOTrainer` on rated answers: each served answer a user rated +1 is desirable,
-1 undesirable, unpaired (most inputs are rated once). The two classes are weighted so that
desirable weight x count over undesirable weight x count lies in [1, 4/3], as the KTO paper
advises; the reference model is a frozen copy of the policy as this method starts.
"""
from __future__ import annotations

import copy

from datasets import Dataset

from common.settings import Settings
from trainer import methods
from trainer.data import RatedAnswer


def class_weights(desirable: int, undesirable: int) -> tuple[float, float]:
    """(desirable_weight, undesirable_weight) with their weighted ratio in [1, 4/3]."""
    if not desirable or not undesirable:
        return 1.0, 1.0
    ratio = desirable / undesirable
    if ratio < 1.0:
        return 1.0 / ratio, 1.0  # up-weight the scarcer desirable class to a ratio of 1
    if ratio > 4 / 3:
        return 1.0, ratio * 3 / 4  # up-weight the undesirable class to a ratio of 4/3
    return 1.0, 1.0


def train(settings: Settings, model, tokenizer, examples: list[RatedAnswer], budget_s: float | methods.Budget, why: str, progress=None) -> methods.TrainingRun:
    from trl import KTOConfig, KTOTrainer

    reference = copy.deepcopy(model).merge_and_unload().eval()
    for param in reference.parameters():
        param.requires_grad_(False)
    good = sum(1 for e in examples if e.label)
    desirable, undesirable = class_weights(good, len(examples) - good)
    config = KTOConfig(**{**methods.trainer_args(settings, settings.preference_epochs, settings.sft_batch_size, len(examples)),
                          "learning_rate": settings.preference_learning_rate},
                       max_length=settings.train_max_length, beta=settings.dpo_beta, desirable_weight=desirable,
                       undesirable_weight=undesirable)
    budget, metrics = methods.TimeBudget(budget_s), methods.StepMetrics()
    rows = [e.row() for e in examples]
    trainer = KTOTrainer(model=model, ref_model=reference, args=config, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer, callbacks=[budget, metrics, methods.Progress("kto", progress)])
    return methods.run(trainer, methods.TrainingRun("kto", why, len(examples)), budget, metrics)
