"""`tucano bench early`: what a newcomer's first answers are worth, before the demo model's
fine-tuning has finished, and what the bootstrap's demonstrations add to them.

The first `tucano serve` answers from the pretrained weights (the demo model's early copy: those
weights with the chat template the fine-tuned model will have) while the fine-tuning runs beside
it, and its prompts show the bootstrap rows most similar to each request (`router.examples`).
Here one vLLM engine serves that early copy and another the fine-tuned demo model, and each task's
test rows (the demo store's own questions, reviews and campaigns) are answered three ways with
the serving prompt, sampling, schema and a fixed seed per row:

- `pretrained`: the early copy, no demonstrations;
- `pretrained + bootstrap rows`: the early copy, the `examples_k` most similar bootstrap rows shown;
- `fine-tuned`: the fine-tuned demo model, no demonstrations (what serves once the fine-tuning is done).

Scored with the rows' references; gains paired by row with 95% intervals; the mean prompt tokens
of each arm. Only the tasks the gateway shows examples for (`examples_tasks`).
"""
from __future__ import annotations

import asyncio
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.learn import interval
from common.datasets import load_split
from common.settings import Settings
from common.tasks import EngineKind
from router.engine_client import EnginePool
from router.examples import ExampleBook, bootstrap_examples
from router.prompts import build_messages
from tasks import TASK_ENGINE, examples_tasks
from trainer import gate


async def _answer(settings: Settings, task: str, url: str, model_path: str, rows: list[gate.EvalRow],
                  shown: dict[str, tuple] | None) -> tuple[list[float], float]:
    """Each row's reference score, and the mean prompt tokens."""
    task_settings = settings.model_copy(update={"base_model": model_path})  # only the base engine's tasks are measured
    pool = EnginePool.for_task(task_settings, task, [url])
    try:
        scores = await gate.answer(pool, task_settings, task, None, rows, settings.seed, shown=shown)
        prompts = [pool.template.render(build_messages(task, row.input, (shown or {}).get(row.id, ()))) for row in rows]
        tokens = [len(pool.template.tokenizer.encode(prompt)) for prompt in prompts]
    finally:
        await pool.close()
    return [s.total for s in scores], sum(tokens) / max(1, len(tokens))


def run(settings: Settings, rows_per_task: int, say=print) -> dict:
    from demo import pretrained
    from demo.bootstrap import with_template
    from demo.templates import TEMPLATES
    from deploy.vllm_server import local_engine, run_engines

    tasks = [t for t in examples_tasks(settings) if TASK_ENGINE[t] == EngineKind.BASE]
    source = pretrained.SOURCES[settings.bootstrap_model]
    weights = settings.models_dir / f"pretrained-{source.name}"
    if not weights.is_dir():
        raise FileNotFoundError(f"no pretrained demo model at {weights}: run `tucano bootstrap` with a pretrained TUCANO_BOOTSTRAP_MODEL")
    results: dict = {"rows_per_task": rows_per_task, "k": settings.examples_k, "pretrained": str(weights),
                     "fine_tuned": settings.base_model_path, "tasks": {}}
    # the copy beside the weights (hard links); the engines stop before it goes
    with tempfile.TemporaryDirectory(prefix="bench-early-", dir=settings.root) as scratch, ExitStack() as stack:
        early = Path(scratch) / "early-base"
        with_template(weights, early, TEMPLATES[source.chat]["base"])  # as the first serve's early copy
        (Path(scratch) / "fine-tuned").mkdir()  # each engine's log in a folder of its own: both are named base
        servers = [local_engine("base", str(early), "cpu", Path(scratch), settings.engine_cpu_precision),
                   local_engine("base", settings.base_model_path, "cpu", Path(scratch) / "fine-tuned", settings.engine_cpu_precision)]
        run_engines(stack, servers, say)
        for task in tasks:
            rows = [gate.EvalRow.of(task, r, "bench")
                    for r in load_split(settings.datasets_dir, task, "test")[:rows_per_task]]
            book = ExampleBook(task, [], bootstrap_examples(task, load_split(settings.datasets_dir, task, "bootstrap")))
            shown = {row.id: tuple((e.input, e.answer) for e in book.similar(row.input, settings.examples_k)) for row in rows}
            arms = {"pretrained": asyncio.run(_answer(settings, task, servers[0].url, str(early), rows, None)),
                    "pretrained + bootstrap rows": asyncio.run(_answer(settings, task, servers[0].url, str(early), rows, shown)),
                    "fine-tuned": asyncio.run(_answer(settings, task, servers[1].url, settings.base_model_path, rows, None))}
            plain = arms["pretrained"][0]
            results["tasks"][task] = {
                arm: {**interval(scores), "prompt_tokens": round(tokens, 1),
                      **({"gain_over_pretrained": interval([a - b for a, b in zip(scores, plain)])} if arm != "pretrained" else {})}
                for arm, (scores, tokens) in arms.items()}
            say(f"{task}: " + ", ".join(f"{arm} {entry['mean']:.3f}" for arm, entry in results["tasks"][task].items()))
    return results


def table(results: dict) -> str:
    cell = lambda e: f"{e['mean']:.3f} [{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}]"
    lines = ["| task | arm | served reward with the reference [95%] | gain over the pretrained model [95%] | mean prompt tokens |",
             "|---|---|---|---|---:|"]
    for task, arms in results["tasks"].items():
        for arm, entry in arms.items():
            gain = entry.get("gain_over_pretrained")
            lines.append(f"| {task} | {arm} | {cell(entry)} | {cell(gain) if gain else '-'} | {entry['prompt_tokens']} |")
    lines.append(f"\n{results['rows_per_task']} test rows per task (at most), {results['k']} demonstrations per prompt; the "
                 f"pretrained weights {results['pretrained']} with the fine-tuned model's template; the fine-tuned model "
                 f"{results['fine_tuned']}. Each row's answer with the task's sampling and a fixed seed.")
    return "\n".join(lines)
