"""The fleet: vLLM engine processes and their supervision (`vllm_server`, with the CPU LoRA plugin
`vllm_cpu_lora`), the embedded Valkey (`embedded_redis`), adapter hot-swap, rollback and canaries
across every engine (`hotswap`), the whole stack in one process tree (`serve`) and what answers
while it starts (`starting`), and what the command line reads and prints of it (`eval_set`,
`history`, `progress`).

It imports the service's packages (`server`, `trainer` and those below them), never the demo
bootstrap: `serve` runs the bootstrap as a `tucano bootstrap` process. Only the benchmarks (`bench`)
and the command line (`cli`) import it.
"""
