"""The uvicorn floor of `tucano bench parts`: a bare ASGI app on the gateway's uvicorn that reads
the body and answers the mock engine's fixed extraction answer, the least any Python gateway on
this server pays per request. Its own module, so that its process imports uvicorn and nothing
of the gateway (the benchmark modules around it import the store, the settings and scipy)."""
from __future__ import annotations

import json

from bench.mock_engine import COMPLETION


def serve(port: str) -> None:
    import uvicorn

    answer = json.dumps({"id": "0" * 32, "output": json.loads(COMPLETION)}).encode()

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            return await send({"type": "lifespan.shutdown.complete"})
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning", access_log=False)
