"""`tucano bootstrap`: build, under the data dir, the commerce DB, the task datasets and the two
tiny demo models, and record in `manifest.json` what was built, from which seed and
settings, how long each step took, and the models' sizes.

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

import torch

from common.datasets import load_split
from common.settings import Settings
from common.tasks import TASK_ENGINE, TASKS
from demo import commerce_db, datasets
from demo.tiny_models import build_tiny_model
from router.prompts import build_messages

STEPS = ("commerce_db", "datasets", "base_model", "think_model")

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
        messages = build_messages(row["task"], row["input"])
        texts.append("\n".join(m["content"] for m in messages) + "\n" + row["target"])
    return texts


class _Manifest:
    """The manifest as the steps see it: which step is up to date, and recording a finished one
    (the file is rewritten atomically after each step)."""

    def __init__(self, settings: Settings, force: bool):
        self.path = settings.manifest_path
        self.data = {} if force else read_manifest(settings)
        self.steps = self.data.setdefault("steps", {})
        self.data["seed"] = settings.seed

    def done(self, name: str, fingerprint: str, target: Path) -> bool:
        return self.steps.get(name, {}).get("fingerprint") == fingerprint and target.exists()

    def finish(self, name: str, fingerprint: str, started: float, **details) -> None:
        self.steps[name] = {"fingerprint": fingerprint, "seconds": round(time.perf_counter() - started, 2), **details}
        self.data["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        _write_json_atomic(self.path, self.data)


def _build_db(settings: Settings, manifest: _Manifest, progress: Progress) -> None:
    """The commerce DB and the labels of its written reviews."""
    root, fingerprint = settings.root, _fingerprint("db-v2", settings.seed, settings.bootstrap_orders)
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


def _build_datasets(settings: Settings, manifest: _Manifest) -> str:
    fingerprint = _fingerprint("datasets-v1", settings.seed, manifest.steps["commerce_db"]["sha256"])
    if manifest.done("datasets", fingerprint, settings.datasets_dir):
        return fingerprint
    started = time.perf_counter()
    labels_path = settings.root / "review_labels.jsonl"
    labelled = [json.loads(line) for line in labels_path.read_text().splitlines() if line]
    partial = settings.root / "datasets.partial"
    _clear(partial)
    counts = datasets.build(settings.db_path, labelled, partial, settings.seed)
    _clear(settings.datasets_dir)
    partial.replace(settings.datasets_dir)
    manifest.finish("datasets", fingerprint, started, rows=counts)
    return fingerprint


def _build_model(settings: Settings, manifest: _Manifest, name: str, datasets_fingerprint: str, progress: Progress) -> None:
    """A tiny model trained on the train splits of the tasks its engine serves; the Think model also
    reads the other tasks' text, for a broader PT-BR vocabulary."""
    engine = name.removesuffix("_model")
    target = settings.models_dir / engine
    fingerprint = _fingerprint("model-v2", name, settings.seed, datasets_fingerprint, settings.bootstrap_lm_steps,
                               settings.bootstrap_sft_steps)
    if manifest.done(name, fingerprint, target / "config.json"):
        return
    started = time.perf_counter()
    tasks = [t for t in TASKS if TASK_ENGINE[t] == engine]
    rows = [r for t in tasks for r in load_split(settings.datasets_dir, t, "train")]
    corpus = _corpus(rows)
    think = engine == "think"
    if think:
        corpus += _corpus([r for t in TASKS if TASK_ENGINE[t] == "base" for r in load_split(settings.datasets_dir, t, "train")])
    total = settings.bootstrap_lm_steps + settings.bootstrap_sft_steps
    offset = {"lm": 0, "sft": settings.bootstrap_lm_steps}
    partial = settings.root / f"{name}.partial"
    _clear(partial)
    random.seed(settings.seed)
    info = build_tiny_model(partial, rows, corpus, think, settings.seed, settings.bootstrap_lm_steps,
                            settings.bootstrap_sft_steps, lambda phase, step, loss: progress(name, offset[phase] + step + 1, total))
    _clear(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial.replace(target)
    manifest.finish(name, fingerprint, started, path=str(target), **info)


def run(settings: Settings, progress: Progress = lambda *_: None, force: bool = False) -> dict:
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
        for name in ("base_model", "think_model"):
            _build_model(settings, manifest, name, datasets_fingerprint, progress)
            progress(name, 1, 1)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise BootstrapError(f"no space left on the device of {root}; free some space and run "
                                 "`tucano bootstrap` again (finished steps are kept)") from None
        if error.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            raise BootstrapError(f"cannot write under {root} ({error.strerror}: {error.filename})") from None
        raise
    return manifest.data


def is_built(settings: Settings) -> bool:
    steps = read_manifest(settings).get("steps", {})
    return all(name in steps for name in STEPS) and settings.db_path.exists() and \
        all((settings.datasets_dir / t / "eval.jsonl").exists() for t in TASKS)
