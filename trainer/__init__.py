"""Everything about learning: a round's data from the labelled set and the new records (`data`),
which methods a task gets (`methods`), one TRL trainer per method (`sft`, `dpo`, `kto`, `grpo`, with its reward as TRL takes it: `grpo_reward`,
and its per-field credit for answers made of JSON fields: `field_credit`),
the policy (`policy`), GRPO's groups sampled on a vLLM engine (`rollouts`), whether serving is idle
(`idle`), the candidate version (`candidate`), the promotion gate (`gate`), shadow
replay (`shadow`), a canary's verdict (`canary`), the examples a promotion retires (`retire`),
the stop conditions (`diagnostics`), the logprobs a version must be served with (`probe`), a
batch's shared prompt prefix (`shared_prefix`), every reach
into TRL's private API (`trl_internals`) and the round end to end (`round`).

Imports `common`, `rewards` and `router`. The fleet (loading versions into engines, flipping
routes, canaries) is handed to a round by whoever runs it (deploy/), so nothing here imports `deploy`.
"""
import logging

# bitsandbytes (imported by PEFT and TRL) warns on every import on a CPU with bf16 that it cannot
# load an optional kernel from the `kernels` package, which would download it from the model hub
# at run time: the package is deliberately not installed, and its own CPU 4-bit path is used.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
