"""The request path: the task registry (engine, sampling defaults and output schema per task,
`registry`), the prompts (`prompts`), the classifier behind `tucano-auto` (`classify`), the
routing table that maps a task's aliases to adapter versions (`routing`) and the vLLM HTTP
client (`engine_client`).

Imports `common` and `rewards` only.
"""
