"""The shared foundation every other package stands on.

What lives here: the one Settings object (`config`), the embedded Redis (`embedded_redis`),
the task specifications and output schemas (`tasks`), the commerce database schema and its
synthetic generator (`commerce_db`, `reviews`), the task datasets (`datasets`), and the
bootstrap manifest (`manifest`).

It imports nothing of ours: `rewards/`, `router/`, `server/`, `trainer/` and `deploy/` all
import from here, never the other way round.
"""
