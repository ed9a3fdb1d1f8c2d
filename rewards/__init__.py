"""Rewards: the product's specification in code. Each task's reward gives a completion named
components in [0, 1], their weights and a readable reason for each; `scoring` makes them one
total in [0, 1] (`Score`). Each task's registry entry (`tasks/`) holds its reward, and
`tasks.score(task, completion, reference=None, context=None)` is the one entry point. The same
functions score live traffic, build the training signal and gate promotions.

Each task has its module (`extraction`, `sql`, `push`,
`insights`), with what they share: parsing a completion (`parsing`), folding and matching text
(`text`), what a review's words say (`review_cues`), what a question asks of its SQL
(`sql_question`), running SQL read-only within limits (`sql_sandbox`), what a reference or a
correction must be (`references`), how far the served score follows the labels (`calibration`)
and the answers that do no work, which every reward holds far below real ones (`trivial`).

Pure and deterministic: everything a score depends on comes in as an argument (each task's
reward takes the task input; the SQL reward also the commerce DB's path, a time limit and a row
cap, which the typed `common.records.RewardContext` carries to it). Imports nothing of ours but
`common`.
"""
from rewards.scoring import REWARD_VERSION, Score

__all__ = ["REWARD_VERSION", "Score"]
