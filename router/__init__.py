"""The router: the task registry (prompts, sampling defaults, output schemas, parsers and
rewards per task), the classifier behind `tucano-auto`, and the routing table that maps a
task's alias to an adapter version.

Imports `foundation` and `rewards` only.
"""
