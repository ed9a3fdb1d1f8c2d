"""The request path: a request's chat from its task's entry (`prompts`), the classifier behind `tucano-auto` (`classify`), the
route table that maps a task's aliases to adapter versions (`route_table`), the team's examples
retrieved into prompts (`examples`) and the vLLM HTTP client, which picks the engine
(`engine_client`).

Imports `common`, `rewards` and `tasks` only.
"""
