"""Rewards: the product's specification in code. One entry point scores any completion of any
task, `score(task, completion, reference=None, context=None)`, with a total in [0, 1], named
components in [0, 1] and a readable reason for each. The same functions score live traffic,
build the training signal (see `rewards.trl` for TRL reward functions) and gate promotions.

Pure and deterministic: everything a score depends on comes in as an argument (the SQL reward
reads the commerce DB named by `context["db_path"]`, within the time limit and row cap the
context gives). Imports nothing of ours but `common`.
"""
from rewards.scoring import REWARD_VERSION, Score, score

__all__ = ["REWARD_VERSION", "Score", "score"]
