"""The fleet: vLLM engine processes and their supervision (`vllm_server`), the embedded Valkey
(`embedded_redis`), adapter hot-swap, rollback and canaries across every engine (`hotswap`), the
whole stack in one process tree (`serve`), the `tucano` command line (`cli`) with what it reads
and prints (`eval_set`, `history`), and the benchmarks (`bench/`).

The top of the import graph: it may import every other package of ours; none imports it.
"""
