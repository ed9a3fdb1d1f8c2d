"""Everything about learning: a round's data from the labelled set and the new records (`data`),
which methods a task gets (`methods`), one TRL trainer per method (`sft`, `dpo`, `kto`, `grpo`),
the policy (`policy`), the candidate version (`candidate`), the promotion gate (`gate`), shadow
replay (`shadow`), a canary's verdict (`canary`), the stop conditions (`diagnostics`) and the
round end to end (`round`).

Imports `common`, `rewards` and `router`. The fleet (loading versions into engines, flipping
routes, canaries) is handed to a round by whoever runs it (deploy/), so nothing here imports `deploy`.
"""
