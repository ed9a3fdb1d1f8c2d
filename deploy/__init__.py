"""The fleet: vLLM engine processes and their supervision (`vllm_server`, with the CPU LoRA plugin
`vllm_cpu_lora`), the embedded Valkey (`embedded_redis`), adapter hot-swap, rollback and canaries
across every engine (`hotswap`), the whole stack in one process tree (`serve`) and what answers
while it starts (`starting`), the command line (`cli`) with what it reads and prints
(`eval_set`, `history`, `progress`), and the benchmarks (`bench/`).

The top of the import graph: it may import every other package of ours; none imports it.
"""
