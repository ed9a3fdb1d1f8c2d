"""`tucano bench busy`: a served request's latency while training runs beside the engines, against
the same requests while it does not, side by side in one run.

On a machine without a GPU a round (and a first serve's fine-tuning of the demo model) trains on
the cores the engines and the gateway serve from, at `TRAINING_NICE` against the engines'
`COMPUTE_NICE` (deploy/vllm_server.py). This measures what that leaves a user. Against the real
stack (vLLM engines, the gateway, an embedded Valkey, all throwaway, as `bench learn` builds them),
one trainer process runs for the whole run, started as `serve` starts its training:

- `round`: a round's SFT of `--train-task` on its train rows (trainer/sft.py, the task's own
  training settings and model, a fresh LoRA), with the threads `serve` gives a round (half the
  cores, at least one);
- `grpo`: a round's GRPO of `--train-task` with its groups sampled on the engine that serves that
  task (trainer/grpo.py's `train_on_engine`, the task's own training settings, a fresh LoRA, the
  task's train rows as prompts, pass after pass), as a round runs it where traffic gave too few
  served groups. Its rollouts decode in the serving engine itself, beside the users' requests;
  the trainer's own threads are half the cores, as for `round`;
- `bootstrap`: the demo model's fine-tuning (demo/finetune.py on the bootstrap rows), with every
  core, as `serve` runs it beside the first answers.

It is paused (SIGSTOP) and resumed (SIGCONT) between blocks of requests, so the quiet and busy
phases share the same engines, gateway, caches and rows; after each pause a quiet block waits
until the engines have nothing running or waiting (a rollout request sent before the pause
decodes on), so it never measures the load; blocks of each held-out test row of the
served tasks go out one request at a time (`--concurrency` in flight), in pairs whose order
alternates (quiet then busy, busy then quiet). Reported per phase: p50 and p95 latency, every
status that was not a 200 (a 503 counts as served when it carries Retry-After; a 504 is a request
that waited out the engine timeout), and the trainer's steps while it ran; the p95 ratio busy
over quiet with a 95% interval over resampled block pairs, against the target of
`LATENCY_TARGET` (issue 64: during a round or the fine-tuning, p95 at most 1.5 times that outside
one, and no request waits out the engine timeout).
"""
from __future__ import annotations

import asyncio
import itertools
import os
import signal
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.learn import start_stack
from bench.stack import start
from common.datasets import load_split
from common.processes import usable_cores
from common.settings import Settings
from common.stats import block_interval, percentile
from deploy.vllm_server import TRAINING_NICE
from tasks import TASK_ENGINE, model_path_of, training_settings
from trainer.idle import engines_idle
from trainer.rollouts import ROLLOUT_TIMEOUT_S

LATENCY_TARGET = 1.5  # p95 while training over p95 without
LOADS = ("round", "grpo", "bootstrap")
TRAINING_LOADS = ("round", "grpo")  # a round of --train-task; the trainer gets half the cores
STEP_MARK = "trainer step"  # each step the trainer takes, as a line of its log
READY_MARK = "trainer training"
READY_TIMEOUT_S = 600.0


def train_beside(load: str, task: str, engine_url: str = "") -> None:
    """The trainer's process: `load`'s training, for ever (the bench stops it), a line per step.
    `engine_url`: the engine that serves `task`, where `grpo` samples its groups."""
    from common.settings import load_settings

    settings = load_settings()

    def step(*_args) -> None:
        print(STEP_MARK, flush=True)

    if load == "bootstrap":
        from common.processes import bf16_on_cpu
        from demo import finetune, pretrained
        from demo.bootstrap import DEFAULT_SFT_STEPS, FINETUNE_LR, training_rows
        from demo.templates import TEMPLATES
        from tasks import TASK_ENGINE, TASKS

        source = pretrained.SOURCES[settings.bootstrap_model]
        rows, templates = training_rows(settings, TASKS), TEMPLATES[source.chat]
        print(READY_MARK, flush=True)
        # a first serve's fine-tuning, with its default steps and schedule, again and again: it builds
        # its examples up front, so one endless run would tokenize millions of them before its first step
        while True:
            finetune.finetune(settings.models_dir / f"pretrained-{source.name}", None, rows, templates,
                              {t for t in TASKS if TASK_ENGINE[t] == "think"}, DEFAULT_SFT_STEPS[settings.bootstrap_model],
                              FINETUNE_LR, settings.seed, bf16_on_cpu(settings.train_cpu_precision), lambda *_: step())
    from bench.learn import reference_examples
    from trainer import methods, sft
    from trainer.policy import load_policy

    if load == "grpo":
        _grpo_beside(settings, task, engine_url, step)
        return
    settings = training_settings(settings, task).model_copy(update={"sft_max_epochs": 10**4})
    examples = reference_examples(settings, task, load_split(settings.datasets_dir, task, "train"))
    model, tokenizer = load_policy(model_path_of(settings, task), None, settings.lora_rank, settings.lora_alpha, "none",
                                   methods.bf16(settings), methods.checkpointing(settings), settings.seed)
    print(READY_MARK, flush=True)
    sft.train(settings, model, tokenizer, examples, [], float("inf"), "bench busy", step)


def _grpo_beside(settings: Settings, task: str, engine_url: str, step) -> None:
    """A round's GRPO on engine rollouts, pass after pass over the task's train rows; each pass's
    reloads get names of their own (an engine never sees a name twice)."""
    from bench.learn import grpo_prompts
    from trainer import grpo, methods
    from trainer.policy import load_policy
    from trainer.rollouts import RolloutFailed

    if not engine_url:
        raise ValueError("the grpo load samples on the engine that serves its task: no engine URL was given")
    settings = training_settings(settings, task)
    prompts = grpo_prompts(settings, task, load_split(settings.datasets_dir, task, "train")[: settings.unlabelled_prompts_per_round])
    model, tokenizer = load_policy(model_path_of(settings, task), None, settings.lora_rank, settings.lora_alpha, "none",
                                   methods.bf16(settings), methods.checkpointing(settings), settings.seed)
    print(READY_MARK, flush=True)
    for number in itertools.count():
        try:
            grpo.train_on_engine(settings, model, tokenizer, task, prompts, engine_url, f"bench-busy-{os.getpid()}-{number}",
                                 float("inf"), "bench busy", step)
        except RolloutFailed as error:  # serving held the engine past the rollouts' limit: a round would stop here
            print(f"pass {number} stopped: {error}", flush=True)


def drained(urls: list[str], timeout_s: float = ROLLOUT_TIMEOUT_S) -> float:
    """Seconds until every engine at `urls` has nothing running or waiting; RuntimeError past
    `timeout_s` (by default the longest a paused trainer's last rollout request may decode on)."""
    started = time.monotonic()
    while not engines_idle(urls):
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"the engines at {', '.join(urls)} were still busy {timeout_s:g} s after the trainer was paused")
        time.sleep(0.5)
    return time.monotonic() - started


def _steps(log_path: Path) -> int:
    return log_path.read_text(errors="replace").count(STEP_MARK)


async def block(url: str, task: str, rows: list[dict], concurrency: int, seed: int) -> list[dict]:
    """Each row sent once, `concurrency` in flight: its seconds, status and whether a 503 said when to come back."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=900) as client:
        async def one(i: int, row: dict) -> dict:
            async with gate:
                started = time.perf_counter()
                response = await client.post(f"{url}/v1/tasks/{task}", json={"input": row["input"], "options": {"seed": seed + i}})
                return {"seconds": time.perf_counter() - started, "status": response.status_code,
                        "retry_after": response.headers.get("retry-after") is not None}
        return list(await asyncio.gather(*(one(i, row) for i, row in enumerate(rows))))


def measure(pairs: list[tuple[list[dict], list[dict]]]) -> dict:
    """Per phase: p50, p95, statuses; the p95 ratio busy/quiet with its interval over block pairs, and the verdict."""
    def p95(answers: list[dict]) -> float:
        return percentile([a["seconds"] for a in answers], 0.95)

    out: dict = {}
    for name, side in (("quiet", 0), ("busy", 1)):
        answers = [a for pair in pairs for a in pair[side]]
        statuses: dict[str, int] = {}
        for a in answers:
            if a["status"] != 200:
                key = f"{a['status']}" + (" with Retry-After" if a["status"] == 503 and a["retry_after"] else "")
                statuses[key] = statuses.get(key, 0) + 1
        out[name] = {"requests": len(answers), "p50_s": round(statistics.median(a["seconds"] for a in answers), 3),
                     "p95_s": round(p95(answers), 3), "not_200": statuses}
    ratio = p95([a for _, busy in pairs for a in busy]) / p95([a for quiet, _ in pairs for a in quiet])
    low, high = block_interval(pairs, lambda chosen: p95([a for _, b in chosen for a in b]) / p95([a for q, _ in chosen for a in q]))
    timed_out = sum(1 for pair in pairs for side in pair for a in side
                    if a["status"] == 504 or (a["status"] == 503 and not a["retry_after"]))
    out["p95_ratio"] = {"ratio": round(ratio, 3), "ci95": [round(low, 3), round(high, 3)],
                        "verdict": "met" if high <= LATENCY_TARGET else "missed" if low > LATENCY_TARGET else "undecided"}
    out["waited_out_or_unanswered"] = timed_out
    return out


def run(settings: Settings, tasks: tuple[str, ...], load: str, train_task: str, pairs: int, block_rows: int, concurrency: int,
        say=print) -> dict:
    if load not in LOADS:
        raise ValueError(f"unknown load {load!r}: one of {', '.join(LOADS)}")
    results: dict = {"settings": {"load": load, "train_task": train_task if load in TRAINING_LOADS else None, "pairs": pairs,
                                  "block_rows": block_rows, "concurrency": concurrency, "training_nice": TRAINING_NICE},
                     "tasks": {}}
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tucano-busy-")))
        bench, _store, _fleet, url = start_stack(settings, scratch, stack, say)
        engine_urls = [*bench.base_engine_urls, bench.think_engine_url]
        # the engine a round of the train task samples on: the first of its kind, as trainer.candidate picks it
        rollout_url = bench.base_engine_urls[0] if TASK_ENGINE[train_task] == "base" else bench.think_engine_url
        log_path = scratch / "trainer.log"
        threads = str(max(1, usable_cores() // 2)) if load in TRAINING_LOADS else str(usable_cores())
        env = {**os.environ, "TUCANO_DATA_DIR": str(settings.root), "OMP_NUM_THREADS": threads}
        env.pop("TUCANO_REDIS_URL", None)
        trainer = start(stack, "bench.busy:train_beside", log_path, load, train_task, rollout_url if load == "grpo" else "", env=env)
        stack.callback(lambda: os.kill(trainer.pid, signal.SIGCONT) if trainer.poll() is None else None)  # a stopped process takes no SIGTERM
        os.setpriority(os.PRIO_PROCESS, trainer.pid, TRAINING_NICE)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while _steps(log_path) < 1:  # its first step done: the model is loaded and training
            if trainer.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the trainer did not start training; log tail:\n{log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(1.0)
        os.kill(trainer.pid, signal.SIGSTOP)
        results["trainer_threads"] = int(threads)
        for task in tasks:
            rows = load_split(settings.datasets_dir, task, "test")
            blocks: list[tuple[list[dict], list[dict]]] = []
            busy_steps, busy_s, drain_s = 0, 0.0, 0.0
            for number in range(pairs):
                chosen = [rows[(number * block_rows + i) % len(rows)] for i in range(block_rows)]
                sides: dict[str, list[dict]] = {}
                for phase in (("quiet", "busy") if number % 2 == 0 else ("busy", "quiet")):
                    if phase == "quiet":
                        drain_s += drained(engine_urls)
                    else:
                        before, started = _steps(log_path), time.perf_counter()
                        os.kill(trainer.pid, signal.SIGCONT)
                    try:
                        sides[phase] = asyncio.run(block(url, task, chosen, concurrency, settings.seed + number * block_rows))
                    finally:
                        if phase == "busy":
                            os.kill(trainer.pid, signal.SIGSTOP)
                            busy_steps += _steps(log_path) - before
                            busy_s += time.perf_counter() - started
                    if trainer.poll() is not None:
                        raise RuntimeError(f"the trainer exited ({trainer.returncode}); log tail:\n"
                                           f"{log_path.read_text(errors='replace')[-2000:]}")
                blocks.append((sides["quiet"], sides["busy"]))
            entry = measure(blocks)
            entry["trainer_steps_while_busy"] = busy_steps
            entry["busy_seconds"] = round(busy_s, 1)
            entry["drain_seconds"] = round(drain_s, 1)  # waited for the paused trainer's last engine requests before quiet blocks
            results["tasks"][task] = entry
            say(f"{task}: p95 quiet {entry['quiet']['p95_s']} s, busy {entry['busy']['p95_s']} s, ratio {entry['p95_ratio']['ratio']} "
                f"{entry['p95_ratio']['ci95']} ({entry['p95_ratio']['verdict']}); {busy_steps} trainer steps in {busy_s:.0f} s; "
                f"not 200: quiet {entry['quiet']['not_200']}, busy {entry['busy']['not_200']}")
    return results


def table(results: dict) -> str:
    s = results["settings"]
    what = {"round": f"a round's SFT of {s['train_task']}",
            "grpo": f"a round's GRPO of {s['train_task']}, its groups sampled on the serving engine",
            "bootstrap": "the demo model's fine-tuning"}[s["load"]]
    lines = [f"Beside {what} ({results.get('trainer_threads')} threads, nice {s['training_nice']}); {s['pairs']} block pairs of "
             f"{s['block_rows']} requests, {s['concurrency']} in flight:", "",
             f"| task | p50 quiet / busy (s) | p95 quiet / busy (s) | p95 ratio [95%], target <= {LATENCY_TARGET} | not 200, quiet | "
             "not 200, busy | requests that waited out the engine or got no Retry-After | trainer steps while busy (s) |",
             "|---|---|---|---|---|---|---:|---|"]
    for task, e in results["tasks"].items():
        r = e["p95_ratio"]
        lines.append(f"| {task} | {e['quiet']['p50_s']} / {e['busy']['p50_s']} | {e['quiet']['p95_s']} / {e['busy']['p95_s']} | "
                     f"{r['ratio']:.2f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] ({r['verdict']}) | {e['quiet']['not_200'] or '-'} | "
                     f"{e['busy']['not_200'] or '-'} | {e['waited_out_or_unanswered']} | {e['trainer_steps_while_busy']} "
                     f"({e['busy_seconds']}) |")
    return "\n".join(lines)
