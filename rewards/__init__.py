"""Rewards: the product's specification in code. One entry point scores any completion of any
task, `score(task, completion, reference=None, context=None)`, with a total in [0, 1], named
components in [0, 1] and a readable reason for each. The same functions score live traffic,
build the training signal (see `rewards.trl` for TRL reward functions) and gate promotions.

Pure and deterministic; the SQL reward only reads the commerce DB. Imports nothing of ours but
`foundation`.
"""
from rewards.scoring import REWARD_VERSION, Score, score

__all__ = ["REWARD_VERSION", "Score", "score"]
