"""Everything about learning: a round's data from the records and the labelled set (`data`),
the policy (`policy`), the TRL methods (`methods`), the candidate version (`candidate`), the
promotion gate (`gate`) and the round end to end (`round`).

Imports `common`, `rewards` and `router`. The fleet (loading versions into engines, flipping
routes) is handed to a round by whoever runs it (deploy/), so nothing here imports `deploy`.
"""
