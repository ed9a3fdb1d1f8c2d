"""The demo bootstrap (`tucano bootstrap`): a synthetic commerce database with the Olist schema,
the task datasets built from it, and two tiny Qwen3-architecture models trained on them, so the
whole loop runs for real where no model hub or real data can be reached.

Only the command line and the tests import it: the gateway, the router, the rewards and the
training rounds never do; they read what it wrote (a database, JSONL files, model dirs).
"""
