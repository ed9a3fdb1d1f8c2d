"""The benchmarks on the mock engine, end to end through the CLI on the bootstrapped data dir:
`bench parts` (the gateway with parts taken away) and `bench peers` with a subset of its sides
(our gateway and the bare hop; LiteLLM and vllm-router install from the registry, which a test
does not reach for). Small runs: they check what is written and that it is consistent, not the
figures, which belong to the full runs."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def _bench(built, *args: str) -> subprocess.CompletedProcess:
    env = {"TUCANO_DATA_DIR": str(built.data_dir), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "cli", "bench", *args], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_bench_parts_takes_each_part_away_and_counts_every_record(built):
    from bench.parts import PARTS, VARIANTS

    _bench(built, "parts", "--concurrency", "1", "--concurrency", "4", "--rounds", "4", "--block", "50")
    results = json.loads((built.bench_dir / "parts.json").read_text())["results"]
    assert [row["concurrency"] for row in results["levels"]] == [1, 4]
    records = results["records"]
    assert records["in_redis"] == records["answered_by_recording_variants"] >= 3 * 2 * 4 * 50  # three variants, two levels, and warm-up
    for row in results["levels"]:
        assert set(row["variants"]) == set(VARIANTS) and set(row["parts"]) == {part for part, _, _ in PARTS}
        assert all(v["failed"] == 0 for v in row["variants"].values())
        # the process CPU clock ticks every 10 ms: the bare floor's ~0.04 ms a request, over 4 x 50
        # requests, can read as 0 (CI, concurrency 4); everything that runs the app is many ticks
        assert all(v["ms"] > 0 for name, v in row["variants"].items() if name != "uvicorn floor")
        # taking work away never costs more than the whole, beyond one tick per block
        tick = 1000 * 0.01 / 50
        served = row["variants"]["served"]["ms"]
        assert row["variants"]["neither"]["ms"] < served + tick and row["variants"]["uvicorn floor"]["ms"] < served
    assert "| uvicorn itself (the floor) |" in (built.bench_dir / "parts.md").read_text()


def test_bench_peers_with_a_subset_of_sides_writes_its_own_files_and_counts_every_record(built):
    _bench(built, "peers", "--side", "tucano", "--side", "python-hop", "--concurrency", "1", "--rate", "50", "--requests", "16",
           "--seconds", "0.5", "--passes", "2", "--delay-ms", "0")
    written = json.loads((built.bench_dir / "peers-tucano-python-hop.json").read_text())["results"]
    assert written["sides"] == ["direct", "tucano", "python-hop"] and written["peers"] == {}
    found = written["delays"][0]
    assert found["records"]["in_redis"] == found["records"]["answered"] > 0
    for row in found["closed"]:
        assert set(row["sides"]) == {"direct", "tucano", "python-hop"}
        assert all(side["failed"] == 0 for side in row["sides"].values())
    (rate_row,) = found["open"]
    assert rate_row["rate"] == 50 and rate_row["sides"]["tucano"]["holds"]
    table = (built.bench_dir / "peers-tucano-python-hop.md").read_text()
    assert "litellm" not in table.split("## Mock")[0]  # no peer was asked for, none is reported missing
    assert (built.bench_dir / "peers-tucano-python-hop.png").is_file()
