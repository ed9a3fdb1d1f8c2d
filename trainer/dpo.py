"""DPO with TRL's `DPOTrainer` on the round's preference pairs: a correction or reference
(chosen) against what was served when it scored lower (rejected), or a liked against a disliked
answer to one input. An NLL term on the chosen answer (RPO: `loss_type=["sigmoid", "sft"]`) keeps
its likelihood up; DPO alone lowers it with the rejected one's, since the two share most tokens.

The reference model is a frozen copy of the policy as this method starts (after SFT, when the
round ran it), so DPO measures preference against what the round already learnt, not against
the bare base model.
"""
from __future__ import annotations

import copy

from datasets import Dataset

from common.settings import Settings
from trainer import methods
from trainer.data import PreferencePair


def train(settings: Settings, model, tokenizer, pairs: list[PreferencePair], budget_s: float | methods.Budget, why: str, progress=None) -> methods.TrainingRun:
    from trl import DPOConfig, DPOTrainer

    reference = copy.deepcopy(model).merge_and_unload().eval()
    for param in reference.parameters():
        param.requires_grad_(False)
    config = DPOConfig(**{**methods.trainer_args(settings, settings.preference_epochs, settings.sft_batch_size, len(pairs)),
                          "learning_rate": settings.preference_learning_rate},
                       max_length=settings.train_max_length, beta=settings.dpo_beta, loss_type=["sigmoid", "sft"],
                       loss_weights=[1.0, 1.0])
    budget, metrics = methods.TimeBudget(budget_s), methods.StepMetrics()
    rows = [p.row() for p in pairs]
    trainer = DPOTrainer(model=model, ref_model=reference, args=config, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer, callbacks=[budget, metrics, methods.Progress("dpo", progress)])
    return methods.run(trainer, methods.TrainingRun("dpo", why, len(pairs)), budget, metrics)
