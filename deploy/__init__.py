"""Deployment: the `tucano` command line, the launch of vLLM engines and of the whole stack
(`serve`), the adapter registry and hot-swap, and the production launch description.

The top of the import graph: it may import every other package of ours; none imports it.
"""
