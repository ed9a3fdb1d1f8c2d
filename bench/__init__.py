"""`tucano bench …`: the performance and learning benchmarks, one module each: what the gateway
costs (`gateway`, `parts` with its bare uvicorn `floor`, `peers`, against the `mock_engine`), the rewards' speed and what they
pay for (`rewards`, `trivial`, `calibration`), training (`train`, `finetune`, `qlora`, `grpo`: GRPO's step time on served groups),
serving while training runs (`busy`), learning
(`learn`, `fix`, `labels`: the review queue's labels against random ones, and `grpo_gain`: what GRPO learns
from reference-free groups alone), best of n (`samples`) and a newcomer's
first serve (`first_answer`, `early`). Their throwaway servers come from `stack`; every result is
written by `results.write` as JSON and Markdown under `<data dir>/bench/`."""
