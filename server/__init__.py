"""The HTTP gateway (FastAPI): contract §5's endpoints. Pydantic models in `schemas` are the
single source of the OpenAPI schema; dependencies live in `deps`, errors in `errors`, one
router module per resource under `routes/`, the app and what it holds (`app`, `state`), the
answering pipeline (render, call vLLM, score, record) in `answering`, the OpenAI chat layer
(`chat`), the dashboard's series (`stats`), the review queue's ranking (`review`) and the
Prometheus metrics (`metrics`).

Imports `common`, `rewards` and `router`; adapter changes are done by a callable that
whoever builds the app (deploy/) hands in, so nothing here imports `deploy`.
"""
