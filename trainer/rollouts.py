"""GRPO's rollouts through a vLLM engine, where traffic gave a round too few served groups.

The policy being trained is saved and loaded into the engine under a fresh name every
`reload_every` optimisation steps (vLLM's runtime LoRA API; a name is never reused, since vLLM
#42125 serves stale cached blocks for a reused one), and each generation batch's prompts are
sampled there, `n` completions per prompt, the batch's prompts in one request (vLLM decodes
them together), with each token's logprob, as the gateway samples a served group. TRL's `GRPOTrainer` receives them through its `rollout_func` and
weighs each token by its importance ratio to the engine's sampling (the same truncated
importance sampling as on served groups: `trl_internals.served_groups_grpo_trainer`), which also
covers the steps taken since the last reload. The previous name is unloaded after each reload,
and the last one when the run ends.

The same engine completes served groups smaller than GRPO's group size (`complete`): each
group's prompt, as its token ids were served, is sampled `size - n` more times on the policy as
the run starts, so a best-of-4 task trains on groups of 8 whose first four are its traffic.

An engine that fails, or answers with fewer completions than asked, stops the run
(`RolloutFailed`): a partial group is never trained as if it were whole.

Serving comes first. The engine that samples a round's groups is the one that answers the team,
and its rollouts decode there at the engine's priority, where a training process's nice does not
reach (`bench busy --load grpo`: the served p95 rose 2.0-2.1x when they did not yield). So a
sampling request goes in only once the engine has held no request for `SERVING_QUIET_S` (vLLM's
own gauges of requests running and waiting), and while it decodes the gauges are watched: when
they rise above what the request itself put there, a user's request has arrived, and the rollout
is cancelled (vLLM aborts a request whose client goes away) and sent again once the engine is
quiet. The run counts the times it yielded and the seconds it waited; waiting longer than
`SERVING_YIELD_LIMIT_S` for one batch stops the run like a failed engine (the round says why).
An engine whose /metrics has no gauges cannot be watched: its requests go in at once, counted.
"""
from __future__ import annotations

import asyncio
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx

from common.records import Sampling
from trainer.data import RolloutGroup
from trainer.idle import PROBE_TIMEOUT_S, load_of

ROLLOUT_TIMEOUT_S = 600.0
PARENT_GROUPS_KEPT = 8  # groups sampled from the starting policy, kept to measure how far the run moved from it
PROMPTS_PER_COMPLETION = 8  # served groups completed in one engine request (vLLM decodes them together)
SERVING_POLL_S = 0.25  # how often the engine's gauges are read while a rollout waits or decodes
SERVING_QUIET_S = 1.0  # how long the engine must have held no request before a rollout goes in
SERVING_YIELD_LIMIT_S = 600.0  # the longest one batch waits for serving before the run stops


def whole_groups(prompts: list[str], size: int) -> list[str]:
    """The prompt of each block of `size` repeats in a generation batch, as TRL's sampler lays a
    group out; RuntimeError for a batch that does not hold whole groups."""
    blocks = [prompts[start:start + size] for start in range(0, len(prompts), size)]
    for block in blocks:
        if len(set(block)) != 1 or len(block) != size:
            raise RuntimeError(f"TRL's batch does not hold whole groups of {size}: {block}")
    return [block[0] for block in blocks]


class RolloutFailed(RuntimeError):
    """The engine could not give a generation batch its whole groups; the run stops there."""


class EngineRollouts:
    """One run's rollouts on the engine at `url`; `sync_weights()` is TRL's hook before a batch.
    `directory`: where the policy is saved for the engine to read (the adapters dir, which every
    engine can read); `step`: the trainer's global step."""

    def __init__(self, url: str, model, name_prefix: str, sampling: Sampling, json_schema: dict | None, reload_every: int,
                 seed: int, directory: Path, step: Callable[[], int] = lambda: 0):
        self.url, self.model, self.prefix = url.rstrip("/"), model, name_prefix
        self.sampling, self.json_schema, self.reload_every, self.seed = sampling, json_schema, max(1, reload_every), seed
        self.step = step
        self.loaded: str | None = None
        self.names: list[str] = []  # every name it loaded, in order (never reused)
        self.synced_at_step: int | None = None
        self.tokens, self.seconds = 0, 0.0  # generated completion tokens and the seconds they took
        self.yielded, self.yield_seconds, self.unwatched = 0, 0.0, 0  # serving first: rollouts cancelled, seconds waited, sent unwatched
        self.parent_groups: list[tuple[list[int], list[list[int]]]] = []  # (prompt ids, completions) sampled before the first reload
        self._dir = directory / f".{name_prefix}"
        self._dir.mkdir(parents=True, exist_ok=True)
        self._client = httpx.Client(timeout=ROLLOUT_TIMEOUT_S)

    def _post(self, path: str, body: dict) -> httpx.Response:
        try:
            return self._client.post(f"{self.url}{path}", json=body)
        except httpx.HTTPError as error:
            raise RolloutFailed(f"the engine at {self.url} failed: {type(error).__name__}: {error}") from None

    def sync_weights(self) -> None:
        """Load the policy as it is now under a fresh name, every `reload_every` steps; unload the one before."""
        step = self.step()
        if self.synced_at_step is not None and step - self.synced_at_step < self.reload_every:
            return
        name = f"{self.prefix}-{len(self.names) + 1}"
        path = self._dir / name
        self.model.save_pretrained(path)
        response = self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        if response.status_code != 200:
            raise RolloutFailed(f"the engine at {self.url} refused the policy as {name}: HTTP {response.status_code} {response.text[:300]}")
        previous, self.loaded, self.synced_at_step = self.loaded, name, step
        self.names.append(name)
        if previous:
            self._unload(previous)

    def _unload(self, name: str) -> None:
        try:
            self._client.post(f"{self.url}/v1/unload_lora_adapter", json={"lora_name": name})
        except httpx.HTTPError:
            pass  # an engine that went away holds nothing
        shutil.rmtree(self._dir / name, ignore_errors=True)

    def generate(self, prompts: list[str], size: int) -> dict:
        """Each block of `size` repeats of a prompt sampled as one group on the loaded policy: the
        batch's prompts in one request (vLLM decodes them together), `n` = `size` each."""
        if self.loaded is None:
            self.sync_weights()
        distinct = whole_groups(prompts, size)
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for whole in self._sample(distinct, size, self.sampling.temperature, self.seed + self.step() * 1000, "sample a group"):
            if len(self.names) == 1 and len(self.parent_groups) < PARENT_GROUPS_KEPT:  # the policy as it started
                self.parent_groups.append((list(whole[0]["prompt_token_ids"]), [list(c["token_ids"]) for c in whole]))
            for choice in whole:
                out["prompt_ids"].append(list(choice["prompt_token_ids"]))
                out["completion_ids"].append(list(choice["token_ids"]))
                out["logprobs"].append(_logprobs(choice))
        return out

    def _sample(self, prompts: list, size: int, temperature: float, seed: int, what: str) -> list[list[dict]]:
        """`size` samples of each of `prompts` (texts or token ids) on the loaded policy, in one
        request, with the task's sampling at `temperature`; the choices of each prompt in order,
        each with its tokens and a logprob per token. RolloutFailed (saying it could not `what`)
        for an engine that fails or a prompt with fewer."""
        body = {"model": self.loaded, "prompt": prompts, "n": size, "logprobs": 0, "return_token_ids": True,
                "temperature": temperature, "top_p": self.sampling.top_p, "max_tokens": self.sampling.max_tokens,
                "frequency_penalty": self.sampling.frequency_penalty, "seed": seed}
        if self.json_schema is not None:
            body["structured_outputs"] = {"json": self.json_schema}
        response = self._post_yielding(body, len(prompts) * size)
        if response.status_code != 200:
            raise RolloutFailed(f"the engine at {self.url} did not {what}: HTTP {response.status_code} {response.text[:300]}")
        choices = sorted(response.json().get("choices") or [], key=lambda c: c.get("index", 0))  # prompt by prompt, n each
        groups = []
        for number in range(len(prompts)):
            group = [c for c in choices if number * size <= c.get("index", -1) < (number + 1) * size]
            whole = [c for c in group if c.get("token_ids") and c.get("prompt_token_ids")
                     and len((c.get("logprobs") or {}).get("token_logprobs") or []) == len(c["token_ids"])]
            if len(whole) != size:
                raise RolloutFailed(f"the engine at {self.url} returned {len(whole)} whole completions of the {size} asked")
            self.tokens += sum(len(c["token_ids"]) for c in whole)
            groups.append(whole)
        return groups

    def serving_first(self) -> dict:
        """What yielding to serving cost this run, for the round's record."""
        return {"rollouts_yielded_to_serving": self.yielded, "seconds_waited_for_serving": round(self.yield_seconds, 1),
                "rollouts_unwatched": self.unwatched}

    def _post_yielding(self, body: dict, requests: int) -> httpx.Response:
        """The completions request, sent while serving leaves the engine alone (module docstring);
        `requests`: what it puts in the engine's gauges (a prompt's `n` samples are `n` requests)."""
        waited_from = time.monotonic()
        while True:
            self._wait_quiet(waited_from)
            started = time.perf_counter()
            response = asyncio.run(self._watched(body, requests))
            self.seconds += time.perf_counter() - started
            if response is not None:
                return response
            self.yielded += 1  # a user's request reached the engine: it goes first

    def _wait_quiet(self, waited_from: float) -> None:
        quiet_since, started = None, time.monotonic()
        try:
            while True:
                load = self._load()
                if load is None:
                    self.unwatched += 1
                    return
                now = time.monotonic()
                quiet_since = (quiet_since or now) if load == 0 else None
                if quiet_since is not None and now - quiet_since >= SERVING_QUIET_S:
                    return
                if now - waited_from > SERVING_YIELD_LIMIT_S:
                    raise RolloutFailed(f"serving kept the engine at {self.url} busy for {SERVING_YIELD_LIMIT_S:g} s: "
                                        "the round's rollouts yield to the team's requests")
                time.sleep(SERVING_POLL_S)
        finally:
            self.yield_seconds += time.monotonic() - started

    def _load(self) -> float | None:
        """Requests running and waiting in the engine; None where its /metrics has no gauges."""
        try:
            return load_of(self._client.get(f"{self.url}/metrics", timeout=PROBE_TIMEOUT_S))
        except httpx.HTTPError as error:
            raise RolloutFailed(f"the engine at {self.url} failed: {type(error).__name__}: {error}") from None

    async def _watched(self, body: dict, requests: int) -> httpx.Response | None:
        """The request's response, or None once a request that is not its own reached the engine
        while it decoded (it is then cancelled, and vLLM aborts it). Its own requests only leave
        the gauges, so once they are all counted any rise is someone else's."""
        async with httpx.AsyncClient(timeout=ROLLOUT_TIMEOUT_S) as client:
            post = asyncio.create_task(client.post(f"{self.url}/v1/completions", json=body))
            counted = None  # the gauges once all its requests are in them
            while True:
                done, _ = await asyncio.wait({post}, timeout=SERVING_POLL_S)
                if done:
                    try:
                        return post.result()
                    except httpx.HTTPError as error:
                        raise RolloutFailed(f"the engine at {self.url} failed: {type(error).__name__}: {error}") from None
                try:
                    load = load_of(await client.get(f"{self.url}/metrics", timeout=PROBE_TIMEOUT_S))
                except httpx.HTTPError:
                    continue  # the request itself says whether the engine failed
                if load is None:
                    continue
                if load > (requests if counted is None else counted):  # more than its own: a user's request arrived
                    post.cancel()
                    await asyncio.gather(post, return_exceptions=True)
                    return None
                if counted is not None or load == requests:
                    counted = load

    def complete(self, groups: list[RolloutGroup], size: int) -> tuple[list[RolloutGroup], int]:
        """Each group of fewer than `size` samples completed to `size` with samples of its prompt
        (its token ids as served) from the policy as loaded now, at the group's own temperature,
        with their logprobs; larger groups as they are. Returns the groups in their order and the
        samples added. The group keeps its version: each sample's importance ratio is taken
        against its own recorded logprobs, whichever version drew it."""
        if self.loaded is None:
            self.sync_weights()
        short = defaultdict(list)  # (samples missing, temperature): the groups that miss them
        for group in groups:
            if group.size < size:
                short[(size - group.size, group.temperature)].append(group)
        completed, added = {}, 0
        for (missing, temperature), batch in short.items():
            for start in range(0, len(batch), PROMPTS_PER_COMPLETION):
                chunk = batch[start:start + PROMPTS_PER_COMPLETION]
                sampled = self._sample([g.prompt_token_ids for g in chunk], missing, temperature, self.seed + len(completed),
                                       "complete a served group")
                for group, whole in zip(chunk, sampled, strict=True):
                    completed[group.key] = replace(group, completion_ids=group.completion_ids + [list(c["token_ids"]) for c in whole],
                                                   logprobs=group.logprobs + [_logprobs(c) for c in whole])
                    added += missing
        return [completed.get(g.key, g) for g in groups], added

    def close(self) -> None:
        if self.loaded:
            self._unload(self.loaded)
            self.loaded = None
        self._client.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _logprobs(choice: dict) -> list[float]:
    """A choice's logprob per token (NaN where the engine gave none)."""
    return [float("nan") if x is None else float(x) for x in choice["logprobs"]["token_logprobs"]]
