"""The HTTP gateway (FastAPI): contract §5's endpoints. Pydantic models in `schemas` are the
single source of the OpenAPI schema; dependencies live in `deps`, errors in `errors`, one
router module per resource under `routes/`, and the answering pipeline (render, call vLLM,
score, record) in `answering`.

Imports `common`, `rewards` and `router`; adapter changes are done by a callable that
whoever builds the app (deploy/) hands in, so nothing here imports `deploy`.
"""
