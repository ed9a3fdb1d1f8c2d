"""Training: the bootstrap of the tiny demo models (`bootstrap_models`) and, later, the
periodic GRPO/DPO rounds on recorded traffic.

Imports `foundation`, `rewards` and `router` (for the prompts a model is trained on).
"""
