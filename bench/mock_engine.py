"""A mock OpenAI-compatible engine for benchmarks of what sits in front of vLLM (`tucano bench
peers`), as TensorZero and LiteLLM measure their gateways' overhead: it answers
`/v1/chat/completions` and `/v1/completions`, streaming or not, with one fixed completion after
a configurable delay, and `/v1/models`, `/health` and the runtime LoRA routes (which a gateway's
probes use). The completion is a valid extraction answer, so a gateway that parses, validates
and scores what comes back does all of that work.

It is a bare asyncio protocol on uvloop, with no framework: it reads a request's headers and
`Content-Length` body, looks for `"stream": true` in the bytes and answers. On one core it serves
several times the fastest rate the benchmark asks of it (its own ceiling is measured and
reported with the results), so it is never what limits a side.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import time

COMPLETION = json.dumps({
    "sentiment": "negative", "sentiment_score": -0.6, "complaint_category": "delivery", "delivery_issue": True,
    "product_mentioned": "fone de ouvido", "would_recommend": False, "urgency": "medium", "requires_response": True,
    "key_phrases": ["entrega atrasada"], "summary": "Cliente reclama do atraso na entrega do fone de ouvido.",
}, ensure_ascii=False)
MODEL = "mock"
STREAM = re.compile(rb'"stream"\s*:\s*true')
HEADER_END = b"\r\n\r\n"


def _response(status: int, body: bytes, content_type: bytes = b"application/json") -> bytes:
    reason = {200: b"OK", 404: b"Not Found", 400: b"Bad Request"}.get(status, b"OK")
    return (b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (status, reason, content_type, len(body))) + body


def _usage() -> dict:
    return {"prompt_tokens": 200, "completion_tokens": 100, "total_tokens": 300}


def _completion_body(chat: bool) -> bytes:
    created = int(time.time())
    if chat:
        body = {"id": "chatcmpl-mock", "object": "chat.completion", "created": created, "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": COMPLETION}, "finish_reason": "stop"}],
                "usage": _usage()}
    else:
        body = {"id": "cmpl-mock", "object": "text_completion", "created": created, "model": MODEL,
                "choices": [{"index": 0, "text": COMPLETION, "finish_reason": "stop", "logprobs": None}], "usage": _usage()}
    return json.dumps(body, ensure_ascii=False).encode()


def _stream_body(chat: bool) -> bytes:
    """The completion in four server-sent events, then the usage and [DONE], in one chunked reply."""
    created, step = int(time.time()), -(-len(COMPLETION) // 4)
    events = []
    for start in range(0, len(COMPLETION), step):
        piece, last = COMPLETION[start:start + step], start + step >= len(COMPLETION)
        if chat:
            choice = {"index": 0, "delta": {"content": piece}, "finish_reason": "stop" if last else None}
            event = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": created, "model": MODEL, "choices": [choice]}
        else:
            choice = {"index": 0, "text": piece, "finish_reason": "stop" if last else None}
            event = {"id": "cmpl-mock", "object": "text_completion", "created": created, "model": MODEL, "choices": [choice]}
        events.append(event)
    events.append({"id": "mock", "object": "chat.completion.chunk" if chat else "text_completion", "created": created, "model": MODEL,
                   "choices": [], "usage": _usage()})
    payload = b"".join(b"data: " + json.dumps(e, ensure_ascii=False).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"%x\r\n" % len(payload) + payload + b"\r\n0\r\n\r\n")


MODELS = _response(200, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "mock", "parent": None}]}).encode())
OK = _response(200, b"{}")
NOT_FOUND = _response(404, b'{"error": {"message": "no such route", "type": "NotFoundError"}}')


class MockEngine(asyncio.Protocol):
    """One connection: requests parsed as they arrive, each answered after `delay_s`, in order."""

    delay_s = 0.0
    answered = 0

    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""
        self.queue: asyncio.Queue = asyncio.Queue()
        self.writer = asyncio.get_running_loop().create_task(self._answer_in_order())

    def connection_lost(self, exc):
        self.writer.cancel()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(HEADER_END)
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            request_line, *header_lines = head.split("\r\n")
            length = 0
            for line in header_lines:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4:end + 4 + length]
            self.buffer = self.buffer[end + 4 + length:]
            method, path = request_line.split(" ")[:2]
            self.queue.put_nowait((method, path.split("?")[0], body))

    async def _answer_in_order(self) -> None:
        while True:
            method, path, body = await self.queue.get()
            if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                chat = path == "/v1/chat/completions"
                reply = _stream_body(chat) if STREAM.search(body) else _response(200, _completion_body(chat))
                type(self).answered += 1
            elif method == "GET" and path == "/v1/models":
                reply = MODELS
            elif path in ("/health", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
                reply = OK
            else:
                reply = NOT_FOUND
            if not self.transport.is_closing():
                self.transport.write(reply)


def serve(port: str, delay_ms: str = "0", cpu: str = "") -> None:
    """Serve on 127.0.0.1:`port` until killed, answering completions after `delay_ms`, on core
    `cpu` alone when one is given."""
    import uvloop

    if cpu:
        os.sched_setaffinity(0, {int(cpu)})
    MockEngine.delay_s = float(delay_ms) / 1000

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(MockEngine, "127.0.0.1", int(port), backlog=4096)
        async with server:
            await server.serve_forever()

    uvloop.run(main())
