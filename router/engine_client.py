"""Clients of the vLLM engines: one pool per model kind (`base`: one or more servers, a fleet;
`think`), each request sent to the next healthy server. The gateway renders prompts itself
(the model's own chat template, loaded from its tokenizer) and calls vLLM's `/v1/completions`,
so the record holds exactly the text the model saw and the hash of the template that made it.

The client is aiohttp: every answered request makes one engine call, and aiohttp spends about a
third of httpx's CPU time on one (measured here, 0.47 vs 1.47 ms per local call), which is most
of what the gateway adds to a request.
"""
from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import msgspec

from common.records import Sampling
from common.settings import ENGINE_TIMEOUT_S, Settings
from tasks import TASK_ENGINE, model_path_of


class EngineUnavailable(RuntimeError):
    """No engine of a kind answered; the gateway turns this into 503 with Retry-After. `failover`:
    the request never reached a model (the engine went away, or it lacks the adapter asked for),
    so another engine of the pool may answer it instead."""

    def __init__(self, message: str, failover: bool = False):
        super().__init__(message)
        self.failover = failover


class EngineTimeout(EngineUnavailable):
    """The engine took the request and did not answer within the pool's timeout. It is not down
    (it stays in the rotation, and another engine would not answer sooner); the gateway answers
    504, not 503, because an answer that long is likely to be as long when asked again."""

    def __init__(self, message: str, seconds: float):
        super().__init__(message)
        self.seconds = seconds


class ReplicaIncomplete(RuntimeError):
    """An engine answers but cannot load a version a route points at: it takes no traffic."""


@dataclass
class Engine:
    url: str
    model: str | None = None  # the base model's served name, discovered from /v1/models
    healthy: bool = False
    last_error: str | None = None
    slow_probes: int = 0  # consecutive health probes that timed out
    last_answer: float = 0.0  # time.monotonic() of the last completion it returned


@dataclass
class Completion:
    text: str
    prompt_tokens: int  # of a group's request: the one prompt's
    completion_tokens: int  # of a group's request: all its completions'
    finish_reason: str | None
    engine: str
    model: str
    # a group's (sampling.n > 1): the tokens the engine sampled and each one's logprob, and the prompt's tokens
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None


@dataclass
class ChatTemplate:
    """A model's chat template, rendered locally exactly as vLLM would render it."""
    tokenizer: object
    sha256: str = field(init=False)

    def __post_init__(self):
        self.sha256 = hashlib.sha256((self.tokenizer.chat_template or "").encode()).hexdigest()[:16]

    def render(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    @classmethod
    def load(cls, model_path: str) -> ChatTemplate:
        from transformers import AutoTokenizer
        return cls(AutoTokenizer.from_pretrained(model_path))


# A busy engine on shared cores can miss a probe's deadline while it is serving fine; only a
# refused connection, or this many timeouts in a row, takes it out of the rotation, and a probe
# that times out does not count while the engine is still returning completions.
SLOW_PROBES_BEFORE_DOWN = 3
ANSWERING_WITHIN_S = 10.0
# vLLM's server closes a keep-alive connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE);
# aiohttp keeps one for 15 s by default, so a request could go out on a connection the server was
# closing and fail ("Server disconnected", "Can not write request body"). Idle connections are
# dropped first on this side, and a request the server dropped before answering is sent once
# more, on a new connection, before the engine is taken out of the rotation: one such drop used
# to make every request a 503 until the next health probe (29 in one benchmark run on shared
# cores).
KEEPALIVE_S = 4.0
# A live request waits at most `engine_timeout_s` (the gateway's setting). A batch its caller
# queues all at once (a gate, an eval, a benchmark) shares the engine between dozens of answers:
# on two CPU cores, 36 insights answers of a gate took over 120 s each and the round failed on
# the timeout.
BATCH_TIMEOUT_S = 900.0
RETRIES_ON_DROPPED_CONNECTION = 1
ADAPTER_LOAD_TIMEOUT_S = 60.0


class EnginePool:
    """`routed_adapters`: the adapter versions (name -> path) that routes point at for this kind
    of engine. Each probe checks that an engine serves all of them and loads the missing ones
    before the engine takes traffic: an engine restarted by whoever supervises it comes back with
    no adapters, and a request routed to a version it lacks would fail (as ART's gateway checks
    every replica before it commits a route)."""

    def __init__(self, kind: str, urls: list[str], template: ChatTemplate, timeout_s: float = ENGINE_TIMEOUT_S,
                 probe_timeout_s: float = 3.0, routed_adapters: Callable[[], dict[str, str]] | None = None):
        if not urls:
            raise ValueError(f"no {kind} engine URL")
        self.kind = kind
        self.engines = [Engine(u.rstrip("/")) for u in urls]
        self.template = template
        self.probe_timeout_s = probe_timeout_s
        self.routed_adapters = routed_adapters or dict
        self._cycle = itertools.cycle(range(len(self.engines)))
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, connect=2.0)
        # A stream is cut only when the engine goes quiet for the whole timeout (before its first
        # token or between two): a long answer that keeps coming is not a slow one.
        self._stream_timeout = aiohttp.ClientTimeout(total=None, connect=2.0, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def for_task(cls, settings: Settings, task: str, urls: list[str]) -> EnginePool:
        """The engines that serve `task`, with its model's chat template, for batch work that waits
        on a whole burst of answers (the gate, shadow replay, retirement, eval, benchmarks)."""
        return cls(TASK_ENGINE[task], urls, ChatTemplate.load(model_path_of(settings, task)), timeout_s=BATCH_TIMEOUT_S)

    def _client(self) -> aiohttp.ClientSession:
        """The session of the running event loop (an aiohttp session is bound to the loop that made it)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            connector = aiohttp.TCPConnector(limit=256, keepalive_timeout=KEEPALIVE_S)
            self._session = aiohttp.ClientSession(timeout=self.timeout, connector=connector, json_serialize=_json_text)
            self._session_loop = loop
        return self._session

    async def check(self) -> bool:
        """Refresh every engine's health, served model name and adapters (loading the routed
        versions it lacks); True when at least one is up."""
        async def probe(engine: Engine) -> None:
            try:
                async with self._client().get(f"{engine.url}/v1/models",
                                              timeout=aiohttp.ClientTimeout(total=self.probe_timeout_s)) as response:
                    response.raise_for_status()
                    listed = await response.json(loads=msgspec.json.decode, content_type=None)
                    roots = [m["id"] for m in listed["data"] if not m.get("parent")]
                    served = frozenset(m["id"] for m in listed["data"] if m.get("parent"))
                missing = {v: path for v, path in self.routed_adapters().items() if v not in served}
                if missing:
                    await self._load(engine, missing)
                engine.model, engine.slow_probes = roots[0], 0
                engine.healthy, engine.last_error = True, None
            except ReplicaIncomplete as error:
                engine.healthy, engine.last_error = False, str(error)
            except TimeoutError:
                if time.monotonic() - engine.last_answer < ANSWERING_WITHIN_S:
                    engine.last_error = "health probe timed out while the engine was returning completions"
                    return
                engine.slow_probes += 1
                engine.last_error = f"timeout on health probe {engine.slow_probes} time(s) in a row"
                if engine.slow_probes >= SLOW_PROBES_BEFORE_DOWN:
                    engine.healthy = False
            except (aiohttp.ClientError, KeyError, IndexError, TypeError, ValueError) as error:
                engine.healthy, engine.last_error = False, f"{type(error).__name__}: {error}"
        await asyncio.gather(*(probe(e) for e in self.engines))
        return any(e.healthy for e in self.engines)

    async def _load(self, engine: Engine, versions: dict[str, str]) -> None:
        """Load routed versions an engine lacks (vLLM's runtime LoRA API); ReplicaIncomplete if it refuses one."""
        for version, path in versions.items():
            try:
                async with self._client().post(f"{engine.url}/v1/load_lora_adapter", json={"lora_name": version, "lora_path": path},
                                               timeout=aiohttp.ClientTimeout(total=ADAPTER_LOAD_TIMEOUT_S)) as response:
                    text = await response.text(errors="replace")
            except (aiohttp.ClientError, TimeoutError) as error:
                raise ReplicaIncomplete(f"lacks routed adapter {version}, and loading it failed: {type(error).__name__}: {error}") from None
            if response.status != 200 and "already" not in text:  # another gateway loaded it first
                raise ReplicaIncomplete(f"lacks routed adapter {version} and refused it: HTTP {response.status} {text[:200]}")

    def _pick(self, skip: frozenset[str] = frozenset()) -> Engine:
        for _ in range(len(self.engines)):
            engine = self.engines[next(self._cycle)]
            if engine.healthy and engine.url not in skip:
                return engine
        raise EngineUnavailable(f"no healthy {self.kind} engine: " + "; ".join(
            f"{e.url} ({e.last_error or 'not checked'})" for e in self.engines))

    def _another(self, skip: frozenset[str]) -> bool:
        return any(e.healthy and e.url not in skip for e in self.engines)

    def _body(self, engine: Engine, prompt: str, adapter: str | None, sampling: Sampling, json_schema: dict | None,
              stream: bool) -> dict:
        body = {"model": adapter or engine.model, "prompt": prompt, "temperature": sampling.temperature,
                "top_p": sampling.top_p, "max_tokens": sampling.max_tokens,
                "frequency_penalty": sampling.frequency_penalty, "stream": stream}
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if json_schema is not None:
            body["structured_outputs"] = {"json": json_schema}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if sampling.n > 1:  # a group: every sample's tokens and logprobs, for training on it as a rollout
            body.update(n=sampling.n, logprobs=0, return_token_ids=True)
        return body

    def _failed(self, engine: Engine, error: Exception, failover: bool = False) -> EngineUnavailable:
        if isinstance(error, aiohttp.ClientConnectionError) and not isinstance(error, aiohttp.ServerTimeoutError):
            engine.healthy = False  # refused, reset or dropped: out of rotation until a probe finds it back
            failover = True
        engine.last_error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if isinstance(error, TimeoutError) and not isinstance(error, aiohttp.ConnectionTimeoutError):
            return EngineTimeout(f"{self.kind} engine {engine.url} did not answer within {self.timeout.total:g} s", self.timeout.total)
        return EngineUnavailable(f"{self.kind} engine {engine.url} failed: {engine.last_error}", failover)

    @asynccontextmanager
    async def _completion(self, engine: Engine, body: dict,
                          timeout: aiohttp.ClientTimeout | None = None) -> AsyncIterator[aiohttp.ClientResponse]:
        """The engine's 200 response to a completion request. A request the server dropped before
        answering (a keep-alive connection it was closing just then) goes once more, on a new
        connection, before the engine is taken out of the rotation. `timeout`: a stream's is cut
        only when the engine goes quiet, anything else's is the session's total."""
        timeout = timeout or (self._stream_timeout if body["stream"] else self.timeout)
        for attempt in range(1 + RETRIES_ON_DROPPED_CONNECTION):
            try:
                response = await self._client().post(f"{engine.url}/v1/completions", json=body, timeout=timeout)
                break
            except (aiohttp.ClientError, TimeoutError) as error:
                if not (_dropped(error) and attempt < RETRIES_ON_DROPPED_CONNECTION):
                    raise self._failed(engine, error) from None
        async with response:
            if response.status != 200:
                text = await response.text(errors="replace")
                # 404 for an adapter: this replica lacks it (restarted, not yet re-verified by a probe)
                lacks_adapter = response.status == 404 and body["model"] != engine.model
                raise self._failed(engine, RuntimeError(f"HTTP {response.status}: {text[:200]}"), failover=lacks_adapter)
            yield response

    async def complete(self, prompt: str, adapter: str | None, sampling: Sampling, json_schema: dict | None) -> Completion:
        """The answer of the next healthy engine; one that goes away (or lacks the adapter) before
        answering hands the request to another."""
        return (await self.complete_group(prompt, adapter, sampling.override(n=1), json_schema))[0]

    async def complete_group(self, prompt: str, adapter: str | None, sampling: Sampling, json_schema: dict | None) -> list[Completion]:
        """`sampling.n` completions of one prompt in one engine request (the prompt's prefill is
        shared), in the engine's order; with n > 1 each carries its token ids and their logprobs.
        An answer with fewer choices than asked is an engine failure, never a smaller group."""
        skip: frozenset[str] = frozenset()
        while True:
            engine = self._pick(skip)
            try:
                return await self._complete_on(engine, prompt, adapter, sampling, json_schema)
            except EngineUnavailable as error:
                skip |= {engine.url}
                if not (error.failover and self._another(skip)):
                    raise

    async def _complete_on(self, engine: Engine, prompt: str, adapter: str | None, sampling: Sampling,
                           json_schema: dict | None) -> list[Completion]:
        if sampling.cuts:
            return await self._first_finished_on(engine, prompt, adapter, sampling, json_schema)
        body = self._body(engine, prompt, adapter, sampling, json_schema, False)
        try:
            async with self._completion(engine, body) as response:
                data = await response.json(loads=msgspec.json.decode, content_type=None)
            completions = _choices(data, sampling.n, engine.url, body_model(adapter, engine))
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise self._failed(engine, error) from None
        engine.last_answer = time.monotonic()
        return completions

    async def _first_finished_on(self, engine: Engine, prompt: str, adapter: str | None, sampling: Sampling,
                                 json_schema: dict | None) -> list[Completion]:
        """The first `sampling.first_finished` of `sampling.n` samples to finish, in the engine's
        order. The group is streamed, and the response is closed as soon as they have: vLLM aborts
        a request whose client went away, so the samples still decoding stop taking the engine's
        steps. A group waits for its longest sample otherwise (SQL: 83 tokens at p95 against 47
        for the greedy answer, docs/results.md). The same total timeout as a whole group's."""
        body = self._body(engine, prompt, adapter, sampling, json_schema, True)
        streamed: dict[int, dict] = {}
        finished: list[int] = []
        try:
            async with self._completion(engine, body, timeout=self.timeout) as response:
                async for chunk in _events(response):
                    for choice in chunk.get("choices") or []:
                        index = choice.get("index", 0)
                        sample = streamed.setdefault(index, {"text": [], "token_ids": [], "logprobs": [],
                                                             "prompt_token_ids": None, "finish_reason": None})
                        _add_delta(sample, choice)
                        if sample["finish_reason"] and index not in finished:
                            finished.append(index)
                    if len(finished) >= sampling.first_finished:
                        response.close()  # the connection goes, and vLLM aborts the samples still decoding
                        break
            if len(finished) < sampling.first_finished:
                raise ValueError(f"the stream ended with {len(finished)} of the {sampling.first_finished} finished samples asked for")
            completions = _streamed_group(streamed, sorted(finished), engine.url, body_model(adapter, engine))
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise self._failed(engine, error) from None
        engine.last_answer = time.monotonic()
        return completions

    async def stream(self, prompt: str, adapter: str | None, sampling: Sampling, json_schema: dict | None,
                     result: dict) -> AsyncIterator[str]:
        """Yield text deltas; fill `result` with usage, finish reason and engine once done. Until
        the first delta, an engine that goes away hands the request to another, as `complete`."""
        skip: frozenset[str] = frozenset()
        while True:
            engine = self._pick(skip)
            yielded = False
            try:
                async for delta in self._stream_on(engine, prompt, adapter, sampling, json_schema, result):
                    yielded = True
                    yield delta
                return
            except EngineUnavailable as error:
                skip |= {engine.url}
                if yielded or not (error.failover and self._another(skip)):
                    raise
                result.clear()

    async def _stream_on(self, engine: Engine, prompt: str, adapter: str | None, sampling: Sampling, json_schema: dict | None,
                         result: dict) -> AsyncIterator[str]:
        body = self._body(engine, prompt, adapter, sampling, json_schema, True)
        started = False
        try:
            async with self._completion(engine, body) as response:
                async for chunk in _events(response):
                    if chunk.get("usage"):
                        result["usage"] = chunk["usage"]
                    for choice in chunk.get("choices") or []:
                        if choice.get("finish_reason"):
                            result["finish_reason"] = choice["finish_reason"]
                        if choice.get("text"):
                            started = True
                            yield choice["text"]
        except (aiohttp.ClientError, TimeoutError) as error:
            raise self._failed(engine, error) from None
        engine.last_answer = time.monotonic()
        result.update(engine=engine.url, model=body_model(adapter, engine), started=started)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _choices(data: dict, n: int, engine: str, model: str) -> list[Completion]:
    """The completions of an engine's answer, in choice order; ValueError for an answer that is not
    a whole group (fewer choices than asked, or a sample without its tokens and logprobs)."""
    choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != n:
        raise ValueError(f"asked for {n} completions, the engine returned {len(choices)}")
    usage = data.get("usage") or {}
    if n == 1:
        choice = choices[0]
        return [Completion(choice["text"], usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                           choice.get("finish_reason"), engine, model)]
    completions = []
    for choice in choices:
        token_ids = choice.get("token_ids")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        if token_ids is None or logprobs is None or len(token_ids) != len(logprobs) or choice.get("prompt_token_ids") is None:
            raise ValueError(f"completion {choice.get('index')} of the group came without its token ids and logprobs")
        completions.append(Completion(choice["text"], usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                                      choice.get("finish_reason"), engine, model, list(token_ids),
                                      [float("nan") if x is None else float(x) for x in logprobs], list(choice["prompt_token_ids"])))
    return completions


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """The chunks of an engine's streamed completion: each server-sent `data:` event, decoded, up
    to `[DONE]`."""
    async for raw in response.content:  # one server-sent-event line at a time
        line = raw.decode("utf-8", errors="replace").strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            yield msgspec.json.decode(line[6:])


def _add_delta(sample: dict, choice: dict) -> None:
    """One streamed chunk of a group's choice, added to what that sample has so far (vLLM sends a
    choice's prompt token ids once, and each chunk's new tokens with their logprobs)."""
    sample["text"].append(choice.get("text") or "")
    sample["token_ids"] += choice.get("token_ids") or []
    sample["logprobs"] += (choice.get("logprobs") or {}).get("token_logprobs") or []
    if choice.get("prompt_token_ids") is not None:
        sample["prompt_token_ids"] = list(choice["prompt_token_ids"])
    if choice.get("finish_reason"):
        sample["finish_reason"] = choice["finish_reason"]


def _streamed_group(streamed: dict[int, dict], finished: list[int], engine: str, model: str) -> list[Completion]:
    """The finished samples of a streamed group as completions, in the engine's order; ValueError
    for one without its tokens, logprobs or prompt tokens. Usage counts every sample's tokens,
    the cut ones' too: the engine decoded them."""
    prompt_ids = next((s["prompt_token_ids"] for s in streamed.values() if s["prompt_token_ids"] is not None), None)
    decoded = sum(len(s["token_ids"]) for s in streamed.values())
    completions = []
    for index in finished:
        sample = streamed[index]
        if prompt_ids is None or not sample["token_ids"] or len(sample["token_ids"]) != len(sample["logprobs"]):
            raise ValueError(f"completion {index} of the group came without its token ids and logprobs")
        completions.append(Completion("".join(sample["text"]), len(prompt_ids), decoded, sample["finish_reason"], engine, model,
                                      sample["token_ids"], [float("nan") if x is None else float(x) for x in sample["logprobs"]],
                                      prompt_ids))
    return completions


def _dropped(error: Exception) -> bool:
    """The server closed the connection under the request (not: refused it, or timed out)."""
    return (isinstance(error, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError))
            and not isinstance(error, aiohttp.ClientConnectorError))


def _json_text(value) -> str:
    # each engine call sends the task's JSON schema and the prompt: msgspec encodes them ~7x faster
    return msgspec.json.encode(value).decode()


def body_model(adapter: str | None, engine: Engine) -> str:
    return adapter or engine.model or "unknown"
