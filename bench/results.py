"""Where benchmark results live, written by `write` alone: `<data dir>/bench/<name>.json`
(machine-readable, with the machine it ran on and when) and `<name>.md` (the table quoted in
notes and in the results log, docs/results.md)."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "affinity": sorted(os.sched_getaffinity(0))}


def write(bench_dir: Path, name: str, results: dict, table: str) -> tuple[Path, Path]:
    bench_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    json_path, md_path = bench_dir / f"{name}.json", bench_dir / f"{name}.md"
    json_path.write_text(json.dumps({"benchmark": name, "at": stamp, "machine": machine(), "results": results}, indent=2))
    md_path.write_text(f"# {name} benchmark ({stamp})\n\n{table}\n")
    return json_path, md_path
