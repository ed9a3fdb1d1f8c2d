"""What every package of the service uses, and nothing else: the one Settings object
(`settings`), the Redis store (`store`), an adapter version's statuses and the only transitions
between them (`lifecycle`), the typed shapes that cross rooms (`records`), the task
specifications and traits (`tasks`), the typed record of learning (`rounds`), the commerce
database's schema (`commerce`), the dataset file format (`datasets`), every bootstrap interval
(`stats`) and the process helpers (`processes`).

It imports nothing of ours: `rewards/`, `router/`, `server/`, `trainer/`, `deploy/` and `demo/`
import from here, never the other way round.
"""
