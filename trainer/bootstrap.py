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

from foundation import commerce_db, datasets
from foundation.config import Settings
from foundation.tasks import TASKS
from router.prompts import build_messages
from trainer.bootstrap_models import build_tiny_model

STEPS = ("commerce_db", "datasets", "base_model", "think_model")
BASE_TASKS = ("extraction", "sql", "push")

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


def run(settings: Settings, progress: Progress = lambda *_: None, force: bool = False) -> dict:
    root = settings.root
    check_writable(root)
    for leftover in root.glob("*.partial"):
        _clear(leftover)
    manifest = {} if force else read_manifest(settings)
    steps = manifest.get("steps", {})
    manifest.update({"seed": settings.seed, "steps": steps})
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 4)))

    def done(name: str, fingerprint: str, target: Path) -> bool:
        entry = steps.get(name, {})
        return entry.get("fingerprint") == fingerprint and target.exists()

    def finish(name: str, fingerprint: str, started: float, **details) -> None:
        steps[name] = {"fingerprint": fingerprint, "seconds": round(time.perf_counter() - started, 2), **details}
        manifest["built_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        _write_json_atomic(settings.manifest_path, manifest)

    try:
        # 1. commerce DB (+ the labels of its written reviews)
        fp_db = _fingerprint("db-v2", settings.seed, settings.bootstrap_orders)
        labels_path = root / "review_labels.jsonl"
        if not (done("commerce_db", fp_db, settings.db_path) and labels_path.exists()
                and commerce_db.file_sha256(settings.db_path) == steps["commerce_db"].get("sha256")):
            started = time.perf_counter()
            partial_db = root / "commerce.db.partial"
            labelled = commerce_db.generate(partial_db, settings.bootstrap_orders, settings.seed,
                                            lambda n: progress("commerce_db", n, settings.bootstrap_orders))
            partial_labels = root / "review_labels.jsonl.partial"
            partial_labels.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in labelled))
            partial_db.replace(settings.db_path)
            partial_labels.replace(labels_path)
            finish("commerce_db", fp_db, started, sha256=commerce_db.file_sha256(settings.db_path),
                   orders=settings.bootstrap_orders, written_reviews=len(labelled))
        progress("commerce_db", 1, 1)

        # 2. task datasets
        fp_ds = _fingerprint("datasets-v1", settings.seed, steps["commerce_db"]["sha256"])
        if not done("datasets", fp_ds, settings.datasets_dir):
            started = time.perf_counter()
            labelled = [json.loads(line) for line in labels_path.read_text().splitlines() if line]
            partial = root / "datasets.partial"
            _clear(partial)
            counts = datasets.build(settings.db_path, labelled, partial, settings.seed)
            _clear(settings.datasets_dir)
            partial.replace(settings.datasets_dir)
            finish("datasets", fp_ds, started, rows=counts)
        progress("datasets", 1, 1)

        # 3-4. the tiny models
        for name, tasks, think in (("base_model", BASE_TASKS, False), ("think_model", ("insights",), True)):
            target = settings.models_dir / name.removesuffix("_model")
            fp = _fingerprint("model-v2", name, settings.seed, fp_ds, settings.bootstrap_lm_steps, settings.bootstrap_sft_steps)
            if done(name, fp, target / "config.json"):
                progress(name, 1, 1)
                continue
            started = time.perf_counter()
            rows = [r for t in tasks for r in datasets.load_split(settings.datasets_dir, t, "train")]
            corpus = _corpus(rows)
            if think:  # the Think model also reads the other tasks' text, for a broader PT-BR vocabulary
                corpus += _corpus([r for t in BASE_TASKS for r in datasets.load_split(settings.datasets_dir, t, "train")])
            total = settings.bootstrap_lm_steps + settings.bootstrap_sft_steps
            offset = {"lm": 0, "sft": settings.bootstrap_lm_steps}
            partial = root / f"{name}.partial"
            _clear(partial)
            random.seed(settings.seed)
            info = build_tiny_model(
                partial, rows, corpus, think, settings.seed, settings.bootstrap_lm_steps, settings.bootstrap_sft_steps,
                lambda phase, step, loss: progress(name, offset[phase] + step + 1, total),
            )
            _clear(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial.replace(target)
            finish(name, fp, started, path=str(target), **info)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise BootstrapError(f"no space left on the device of {root}; free some space and run "
                                 "`tucano bootstrap` again (finished steps are kept)") from None
        if error.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            raise BootstrapError(f"cannot write under {root} ({error.strerror}: {error.filename})") from None
        raise
    return manifest


def is_built(settings: Settings) -> bool:
    steps = read_manifest(settings).get("steps", {})
    return all(name in steps for name in STEPS) and settings.db_path.exists() and \
        all((settings.datasets_dir / t / "eval.jsonl").exists() for t in TASKS)
