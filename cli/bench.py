"""`tucano bench …`: one command per benchmark of the `bench` package, each writing its results
through `report`. A benchmark's module is imported inside its command: several import torch."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.shared import built_settings, console, fail, known_tasks, read_settings, report, task_option
from common.settings import GRPO_ADVANTAGES

app = typer.Typer(no_args_is_help=True, help="Performance benchmarks (results under <data dir>/bench).")


@app.command("rewards")
def bench_rewards(seconds: Annotated[float, typer.Option(help="Seconds of scoring per task.")] = 3.0) -> None:
    """Scores per second per task on one core (eval-split answers and realistic variants)."""
    from bench import rewards as bench

    settings = built_settings()
    results = bench.run(settings, seconds)
    report(settings, "rewards", results, bench.table(results))


@app.command("trivial")
def bench_trivial(
    rows: Annotated[int, typer.Option(help="Test rows per task.", min=4)] = 60,
    served: Annotated[bool, typer.Option(help="Start the engines and score the demo model's own answers beside the others.")] = True,
    save_answers: Annotated[str | None, typer.Option(help="Write the model's answers with their rows to this JSONL file.")] = None,
) -> None:
    """The references, the demo model's answers and answers that do no work, scored side by side."""

    from bench import trivial as bench

    settings = built_settings()
    results = bench.run(settings, rows, served, Path(save_answers) if save_answers else None, say=console.print)
    report(settings, "trivial", results, bench.table(results))


@app.command("early")
def bench_early(rows: Annotated[int, typer.Option(help="Test rows per task.", min=4)] = 60) -> None:
    """The pretrained demo model's answers, with and without the bootstrap rows as demonstrations,
    beside the fine-tuned model's: what a first serve answers before its fine-tuning is done."""
    from bench import early as bench

    settings = built_settings()
    try:
        results = bench.run(settings, rows, say=console.print)
    except FileNotFoundError as missing:
        raise fail(str(missing), 2) from None
    report(settings, "early", results, bench.table(results))


@app.command("first-answer")
def bench_first_answer(
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.", min=60)] = 3600.0,
    keep: Annotated[bool, typer.Option(help="Keep the fresh data dir (its logs) afterwards.")] = False,
    ask_every: Annotated[float, typer.Option(help="Seconds between questions after the first answer (each keeps an engine "
                                                  "busy beside the fine-tuning).", min=1)] = 30.0,
) -> None:
    """A newcomer's first `tucano serve` on a fresh data dir: seconds to the first answer and until the
    fine-tuned demo model serves, each process's peak memory, and a clean stop."""
    from bench import first_answer as bench

    settings = read_settings()
    results = bench.run(settings, timeout, say=lambda text: console.print(text, highlight=False), keep=keep, ask_every_s=ask_every)
    report(settings, "first-answer", results, bench.table(results))


@app.command("finetune")
def bench_finetune(
    steps: Annotated[int, typer.Option(help="Steps per arm.", min=2)] = 8,
    arm: Annotated[list[str] | None, typer.Option(help="Arms (repeatable): plain, checkpointing.")] = None,
    task: Annotated[str | None, typer.Option(help="Measure a round's SFT of this task instead of the bootstrap's fine-tuning.")] = None,
) -> None:
    """The bootstrap's fine-tuning (TRL's SFTTrainer), or with --task a round's SFT of that task,
    with and without gradient checkpointing: seconds per step and peak memory, each arm in its own process."""
    from bench import finetune as bench

    task_option(task)
    settings = built_settings()
    if settings.bootstrap_model == "tiny" and task is None:
        raise fail("the tiny models are built from scratch, not fine-tuned: set TUCANO_BOOTSTRAP_MODEL to a pretrained demo model", 2)
    arms = tuple(arm or bench.ARMS)
    unknown = [a for a in arms if a not in bench.ARMS]
    if unknown:
        raise fail(f"unknown arm {unknown}; arms are {', '.join(bench.ARMS)}", 2)
    try:
        results = bench.run(settings, steps, arms, say=lambda text: console.print(text, highlight=False), task=task)
    except RuntimeError as error:
        raise fail(str(error)) from None
    report(settings, f"finetune-{task}" if task else "finetune", results, bench.table(results))


@app.command("calibration")
def bench_calibration(
    answers: Annotated[str | None, typer.Option(help="A JSONL file of answers with references (`bench trivial --save-answers`).")] = None,
    team: Annotated[bool, typer.Option(help="Also the labels of the team's traffic in Redis (needs TUCANO_REDIS_URL or a running serve).")] = False,
) -> None:
    """The served score against labels: rank correlation with the reference score, and liked above corrected."""

    from bench import calibration as bench

    settings = read_settings()
    if answers is None and not team:
        raise fail("give --answers FILE, --team, or both")
    path = Path(answers) if answers else None
    if path is not None and not path.is_file():
        raise fail(f"no answers file at {path}")
    store = None
    if team:
        from common.store import Store

        if not settings.redis_url:
            raise fail("--team reads the Redis that `tucano serve` uses: set TUCANO_REDIS_URL to it")
        store = Store(settings.redis_url)
        if not store.ping():
            raise fail(f"Redis at {settings.redis_url} does not answer: start `tucano serve` or set TUCANO_REDIS_URL")
    results = bench.run(settings, path, store)
    report(settings, "calibration", results, bench.table(results))


@app.command("fix")
def bench_fix(
    task: Annotated[list[str] | None, typer.Option(help="Tasks (repeatable; default sql and push).")] = None,
    corrections: Annotated[int, typer.Option(min=4, help="Corrections per task.")] = 30,
    measure_rows: Annotated[int, typer.Option(min=8, help="Held-out rows per task the served reward is measured on.")] = 40,
) -> None:
    """Time-to-fix: served reward on held-out rows at once (examples), after the next round, and both."""
    from bench import fix as bench

    tasks = known_tasks(task or ("sql", "push"))
    settings = built_settings()
    results = bench.run(settings, tasks, corrections, measure_rows, say=lambda text: console.print(text, highlight=False))
    report(settings, "fix", results, bench.table(results))


@app.command("samples")
def bench_samples(
    task: Annotated[list[str] | None, typer.Option(help="Tasks (repeatable; default extraction, sql and push).")] = None,
    samples: Annotated[list[int] | None, typer.Option(min=2, max=32, help="Group sizes to compare with 1 (repeatable; default 4).")] = None,
    measure_rows: Annotated[int, typer.Option(min=10, help="Held-out rows per task.")] = 40,
    temperature: Annotated[float | None, typer.Option(min=0.0, max=2.0, help="A group's temperature; unset: the task's own.")] = None,
    first_finished: Annotated[list[int] | None, typer.Option(
        min=0, max=31, help="Per group size, an arm answered from the first K samples to finish, the rest cut (repeatable; "
                            "0: wait for all, the default).")] = None,
) -> None:
    """Best of n: reward with references on held-out rows and p95 latency, each group size beside one sample."""
    from bench import samples as bench

    tasks = known_tasks(task or ("extraction", "sql", "push"))
    sizes = samples or [4]
    try:
        bench.arms_of(sizes, first_finished)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--first-finished") from None
    settings = built_settings()
    results = bench.run(settings, tasks, sizes, measure_rows, temperature, say=lambda text: console.print(text, highlight=False),
                        first_finished=first_finished)
    report(settings, "samples", results, bench.table(results))


@app.command("busy")
def bench_busy(
    task: Annotated[list[str] | None, typer.Option(help="Served tasks (repeatable; default sql and push).")] = None,
    load: Annotated[str, typer.Option(help="What trains beside them: round (a round's SFT), grpo (a round's GRPO, its groups "
                                           "sampled on the serving engine) or bootstrap (the demo model's fine-tuning).")] = "round",
    train_task: Annotated[str, typer.Option(help="The task whose round trains (--load round or grpo).")] = "sql",
    pairs: Annotated[int, typer.Option(min=2, help="Block pairs (quiet and busy) per task.")] = 8,
    block_rows: Annotated[int, typer.Option(min=1, help="Requests per block.")] = 5,
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Requests in flight.")] = 1,
) -> None:
    """Served p95 latency while training runs beside the engines, against the same requests without, side by side."""
    from bench import busy as bench

    tasks = known_tasks(task or ("sql", "push"))
    known_tasks((train_task,), "--train-task")
    if load not in bench.LOADS:
        raise fail(f"--load {load!r}: one of {', '.join(bench.LOADS)}", 2)
    settings = built_settings()
    results = bench.run(settings, tasks, load, train_task, pairs, block_rows, concurrency, say=lambda text: console.print(text, highlight=False))
    report(settings, f"busy-{load}", results, bench.table(results))


@app.command("grpo")
def bench_grpo(
    task: Annotated[str, typer.Option(help="The task whose served groups GRPO trains on.")] = "push",
    groups: Annotated[int, typer.Option(min=2, help="Groups sampled on the engine from the task's train rows.")] = 32,
    steps: Annotated[int, typer.Option(min=2, help="GRPO steps per arm and repeat.")] = 16,
    repeats: Annotated[int, typer.Option(min=1, max=6, help="Times each arm trains, the arms taking turns.")] = 2,
) -> None:
    """Seconds per GRPO step with each group's prompt run once, beside TRL's own forward, on the same served groups."""
    from bench import grpo as bench

    known_tasks((task,))
    settings = built_settings()
    results = bench.run(settings, task, groups, steps, repeats, say=lambda text: console.print(text, highlight=False))
    report(settings, f"grpo-{task}", results, bench.table(results))


@app.command("grpo-gain")
def bench_grpo_gain(
    task: Annotated[str, typer.Option(help="A task scored with references (extraction, sql, push).")] = "extraction",
    groups: Annotated[int, typer.Option(min=2, help="Groups sampled on the engine from the task's train rows, without references.")] = 48,
    epochs: Annotated[list[float] | None, typer.Option(min=0.1, max=8, help=(
        "Passes of GRPO over the groups, one arm each with every rate (repeatable; default 1)."))] = None,
    learning_rate: Annotated[list[float] | None, typer.Option("--lr", min=1e-7, max=1e-2,
                                                            help="GRPO learning rates, one arm each (repeatable; default the task's).")] = None,
    measure_rows: Annotated[int, typer.Option(min=3, help="Held-out test rows each arm and the base model answer.")] = 40,
    temperature: Annotated[list[float] | None, typer.Option(min=0.05, max=2.0, help=(
        "Temperatures the groups are sampled at, each its own groups and arms (repeatable; default the task's group temperature)."))] = None,
    picks: Annotated[bool, typer.Option(help="Also train, on each temperature's groups, an arm of SFT on each group's served pick.")] = False,
    gate_rows: Annotated[int, typer.Option(min=0, help=(
        "Also measure every arm on the first N rows of the gate's eval split (0: none)."))] = 0,
    group_size: Annotated[list[int] | None, typer.Option(min=2, max=16, help=(
        "Completions a group, each size its own groups and arms (repeatable; default TUCANO_GRPO_NUM_GENERATIONS)."))] = None,
    advantage: Annotated[list[str] | None, typer.Option(help=(
        "GRPO advantages, each its own arm (repeatable: sum, gdpo, fields; default the task's TUCANO_GRPO_ADVANTAGE)."))] = None,
    entropy_coef: Annotated[list[float] | None, typer.Option(min=0.0, max=1.0, help=(
        "GRPO entropy bonus coefficients, each its own arm (repeatable; default TUCANO_GRPO_ENTROPY_COEF)."))] = None,
    beta: Annotated[list[float] | None, typer.Option(min=0.0, max=10.0, help=(
        "GRPO KL penalties to the base model, each its own arm (repeatable; default the task's TUCANO_GRPO_BETA)."))] = None,
) -> None:
    """What a round's GRPO learns from reference-free groups alone, on held-out rows with references, against the base model."""
    from bench import grpo_gain as bench
    from tasks import TASKS, TRAITS

    known_tasks((task,))
    if not TRAITS[task].scored_with_reference:
        raise fail(f"--task: {task} has no references to measure a gain with; choose one of "
                   f"{', '.join(t for t in TASKS if TRAITS[t].scored_with_reference)}", 2)
    if 0 < gate_rows < 3:
        raise fail(f"--gate-rows: {gate_rows} rows give no interval; ask for at least 3, or 0 for none", 2)
    unknown = [a for a in advantage or [] if a not in GRPO_ADVANTAGES]
    if unknown:
        raise fail(f"--advantage: {', '.join(map(repr, unknown))} is not one of {', '.join(GRPO_ADVANTAGES)}", 2)
    settings = built_settings()
    results = bench.run(settings, task, groups, epochs or [], learning_rate or [], measure_rows, say=lambda text: console.print(text, highlight=False),
                        temperatures=temperature or [], picks=picks, gate_rows=gate_rows, sizes=list(dict.fromkeys(group_size or [])),
                        advantages=list(dict.fromkeys(advantage or [])), entropy_coefs=list(dict.fromkeys(entropy_coef or [])),
                        betas=list(dict.fromkeys(beta or [])))
    report(settings, f"grpo-gain-{task}", results, bench.table(results))


@app.command("labels")
def bench_labels(
    task: Annotated[list[str] | None, typer.Option(help="Tasks (repeatable; default sql and push).")] = None,
    requests: Annotated[int, typer.Option(min=8, help="Requests per task, the answers the labels are chosen from.")] = 60,
    labels: Annotated[int, typer.Option(min=2, help="Labels per arm (the queue's, and each random draw's).")] = 30,
    draws: Annotated[int, typer.Option(min=1, max=10, help="Random draws of the same number of labels.")] = 2,
    measure_rows: Annotated[int, typer.Option(min=8, help="Held-out rows per task the reward is measured on.")] = 40,
    epochs: Annotated[float | None, typer.Option(min=0.5, max=20, help=(
        "Epochs of SFT over each arm's labels, with no time budget: every arm takes the same steps (default: one round's "
        "time budget, which buys fewer steps on longer references)."))] = None,
    trainings: Annotated[int, typer.Option(min=1, max=5, help=(
        "Trainings of each arm's labels, from consecutive seeds; each held-out row's reward is their mean, so an arm's gain "
        "is what its labels teach rather than one training's luck."))] = 1,
    name: Annotated[str, typer.Option(help="Result name under <data dir>/bench.")] = "labels",
) -> None:
    """The review queue's labels against random ones, side by side on the same traffic: what each set teaches per label."""
    from bench import labels as bench

    tasks = known_tasks(task or ("sql", "push"))
    if labels > requests:
        raise fail(f"--labels ({labels}) cannot be more than --requests ({requests}): the labels are chosen from the answers", 2)
    settings = built_settings()
    results = bench.run(settings, requests, labels, draws, measure_rows, tasks, say=lambda text: console.print(text, highlight=False),
                        epochs=epochs, trainings=trainings)
    report(settings, name, results, bench.table(results))


@app.command("gateway")
def bench_gateway(
    concurrency: Annotated[list[int], typer.Option(help="Concurrency levels (repeat the option).")] = [1, 8, 32],  # noqa: B006
    requests: Annotated[int, typer.Option(min=8, help="Requests per level (at least twice the concurrency).")] = 64,
    max_tokens: Annotated[int, typer.Option(min=1, max=2048, help="Completion tokens per request.")] = 32,
    shared_cores: Annotated[bool, typer.Option("--shared-cores", help=(
        "Leave a local CPU engine on the same cores as the gateway (by default it gets cores of its own, "
        "as on a GPU box)."))] = False,
) -> None:
    """Latency and throughput straight to vLLM and through the gateway, side by side."""
    from bench import gateway as bench

    settings = built_settings()
    if any(c < 1 or c > 256 for c in concurrency):
        raise fail("--concurrency must be between 1 and 256", 2)
    results = bench.run(settings, sorted(set(concurrency)), requests, max_tokens, shared_cores, say=console.print)
    report(settings, "gateway", results, bench.table(results))


@app.command("peers")
def bench_peers(
    concurrency: Annotated[list[int], typer.Option(help="Closed-loop concurrency levels (repeat the option).")] = [1, 8, 32, 128],  # noqa: B006
    rate: Annotated[list[float], typer.Option(help="Open-loop request rates per second (repeat the option).")] = [100, 500, 1000],  # noqa: B006
    requests: Annotated[int, typer.Option(min=16, help="Closed-loop requests per side per level.")] = 256,
    seconds: Annotated[float, typer.Option(min=0.5, max=60, help="Seconds per open-loop pass.")] = 3.0,
    passes: Annotated[int, typer.Option(min=2, max=20, help="Open-loop passes per side per rate (alternating order).")] = 4,
    delay_ms: Annotated[list[float], typer.Option(help="Mock engine delays in ms (repeat the option).")] = [0, 20],  # noqa: B006
    side: Annotated[list[str], typer.Option(help="Sides measured against the mock (repeat the option): tucano, python-hop, litellm, "
                                                 "vllm-router. Fewer than all writes peers-<sides>.*, not peers.*")] = [],  # noqa: B006
) -> None:
    """Our gateway against LiteLLM's proxy and vllm-router, side by side on a mock engine."""
    from bench import peers as bench

    settings = built_settings()
    if any(c < 1 or c > 1024 for c in concurrency) or any(r <= 0 or r > 20_000 for r in rate) or any(d < 0 or d > 10_000 for d in delay_ms):
        raise fail("--concurrency must be 1-1024, --rate above 0 and at most 20000, --delay-ms 0-10000", 2)
    unknown = sorted(set(side) - set(bench.SIDES[1:]))
    if unknown:
        raise fail(f"--side takes {', '.join(bench.SIDES[1:])}; not {', '.join(unknown)}", 2)
    peers = tuple(s for s in bench.SIDES[1:] if s in side) if side else bench.SIDES[1:]
    name = "peers" if peers == bench.SIDES[1:] else "peers-" + "-".join(peers)
    results = bench.run(settings, sorted(set(concurrency)), sorted(set(rate)), requests, seconds, passes, list(dict.fromkeys(delay_ms)),
                        say=console.print, peers=peers, name=name)
    settings.bench_dir.mkdir(parents=True, exist_ok=True)
    bench.plot(results, settings.bench_dir / f"{name}.png")
    report(settings, name, results, bench.table(results) + f"\n\n![added latency]({name}.png)")


@app.command("parts")
def bench_parts(
    concurrency: Annotated[list[int], typer.Option(help="Closed-loop concurrency levels (repeat the option).")] = [1, 16],  # noqa: B006
    rounds: Annotated[int, typer.Option(min=4, max=100, help="Rounds of blocks per level (each variant once per round).")] = 10,
    block: Annotated[int, typer.Option(min=50, max=10_000, help="Requests per block.")] = 300,
) -> None:
    """Where our gateway's CPU per request goes: the gateway with parts taken away, side by side."""
    from bench import parts as bench

    settings = built_settings()
    if any(c < 1 or c > 1024 for c in concurrency):
        raise fail("--concurrency must be 1-1024", 2)
    results = bench.run(settings, sorted(set(concurrency)), rounds, block, say=console.print)
    report(settings, "parts", results, bench.table(results))


@app.command("train")
def bench_train(round_id: Annotated[str | None, typer.Option("--round", help="A round id (default: the latest that trained).")] = None) -> None:
    """Wall time per phase and tokens per second of a finished training round."""
    from bench import train as bench

    settings = read_settings()
    try:
        summary = bench.find_round(settings.rounds_dir, round_id)
    except LookupError as error:
        raise fail(str(error)) from None
    from demo.bootstrap import read_manifest

    parameters = read_manifest(settings).get("steps", {}).get("base_model", {}).get("parameters")
    results = bench.results(summary, parameters)
    report(settings, "train", results, bench.table(results))


@app.command("qlora")
def bench_qlora(
    shape: Annotated[str, typer.Option(help="An architecture measured with random weights: smollm2-135m, qwen3-1.7b or qwen3-8b.")] = "smollm2-135m",
    model: Annotated[Path | None, typer.Option(help="A checkpoint directory instead of a shape.")] = None,
    batch: Annotated[int, typer.Option(min=1)] = 8,
    length: Annotated[int, typer.Option(min=8, max=8192)] = 512,
    steps: Annotated[int, typer.Option(min=2)] = 20,
) -> None:
    """Peak accelerator memory and seconds per training step with the base in full precision and in 4-bit NF4."""
    from bench import qlora as bench

    if model is None and shape not in bench.SHAPES:
        raise fail(f"unknown shape {shape!r}: one of {', '.join(sorted(bench.SHAPES))}, or --model DIR", 2)
    if model is not None and not (model / "config.json").is_file():
        raise fail(f"{model} is not a checkpoint (no config.json)", 2)
    settings = read_settings()
    results = bench.run(str(model) if model else None, shape, batch, length, steps, warmup=3)
    report(settings, "qlora", results, bench.table(results))


@app.command("learn")
def bench_learn(
    rounds: Annotated[int, typer.Option(min=1, max=20, help="Training rounds.")] = 3,
    requests: Annotated[int, typer.Option(min=8, help="Requests per task per round.")] = 150,
    correction_rate: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of answers corrected.")] = 0.2,
    rating_rate: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of answers rated.")] = 0.3,
    measure_rows: Annotated[int, typer.Option(min=8, help="Held-out rows per task the served reward is measured on.")] = 60,
    task: Annotated[list[str] | None, typer.Option(help="Only these tasks (repeatable).")] = None,
    oracle: Annotated[bool, typer.Option(help="Also train the oracle (SFT on every request's reference).")] = True,
    ablation: Annotated[list[str] | None, typer.Option(help="Tasks of the GRPO sum-vs-gdpo ablation (repeatable; default push).")] = None,
    no_ablation: Annotated[bool, typer.Option("--no-ablation", help="Skip the GRPO ablation.")] = False,
    canary: Annotated[str | None, typer.Option(help="Task whose oracle runs a canary on live traffic.")] = "extraction",
    no_canary: Annotated[bool, typer.Option("--no-canary", help="Skip the canary run.")] = False,
    label_curve: Annotated[list[int] | None, typer.Option(min=2, help="Also SFT from the base model on the first K requests' "
                                                            "references, per task (repeatable): label-bound or model-bound.")] = None,
    label_choice: Annotated[str, typer.Option(help="Which answers the team labels: `random`, or `queue` (the review queue's "
                                                   "order: the answers a label would help most first).")] = "random",
    traffic_only: Annotated[bool, typer.Option("--traffic-only", help="No corrections and no ratings: the rounds learn from the "
                                               "traffic alone (GRPO on the reference-free rewards); the held-out reward is still "
                                               "scored with references.")] = False,
    name: Annotated[str, typer.Option(help="Result name under <data dir>/bench.")] = "learn",
) -> None:
    """Play a team (traffic, corrections, ratings) for R rounds against the real stack; served reward per round on held-out rows."""
    from bench import learn as bench
    from tasks import TASKS

    tasks = known_tasks(task or TASKS)
    known_tasks(ablation or (), "--ablation")
    known_tasks(() if no_canary else (canary,), "--canary")
    if label_choice not in ("random", "queue"):
        raise fail(f"--label-choice takes random or queue, not {label_choice!r}", 2)
    if traffic_only:
        correction_rate = rating_rate = 0.0
    if correction_rate + rating_rate > 1:
        raise fail("--correction-rate and --rating-rate add up to more than 1", 2)
    settings = built_settings()
    results = bench.run(settings, rounds, requests, correction_rate, rating_rate, measure_rows, tasks, oracle,
                        () if no_ablation else tuple(ablation or ("push",)), None if no_canary else canary,
                        tuple(label_curve or ()), keep=settings.bench_dir / name, say=lambda text: console.print(text, highlight=False),
                        label_choice=label_choice)
    settings.bench_dir.mkdir(parents=True, exist_ok=True)
    bench.plot(results, settings.bench_dir / f"{name}.png")
    report(settings, name, results, bench.table(results) + f"\n\n![learning curves]({name}.png)")
    bench.partial_path(settings.bench_dir / name).unlink(missing_ok=True)


