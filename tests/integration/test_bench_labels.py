"""`tucano bench labels` end to end on the session's engines (configured URLs: it starts no
engine of its own) with the tiny models: traffic through its own gateway, the review queue read
over HTTP, each arm trained and measured, then unloaded. A small run: it checks what each arm
trained on and what is written, not the figures, which belong to the full runs."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx

from tests.conftest import REPO


def test_bench_labels_trains_each_arm_on_its_own_labels_and_leaves_the_engines_as_they_were(built, engines):
    env = {"TUCANO_DATA_DIR": str(built.data_dir), "TUCANO_BASE_ENGINE_URLS": json.dumps([engines["base"].url]),
           "TUCANO_THINK_ENGINE_URL": engines["think"].url, "TUCANO_TRAIN_TIME_BUDGET_S": "6", "TUCANO_TASK_TRAINING": "{}",
           "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    before = {card["id"] for card in httpx.get(f"{engines['base'].url}/v1/models", timeout=30).json()["data"]}
    result = subprocess.run([sys.executable, "-m", "deploy.cli", "bench", "labels", "--task", "push", "--requests", "10",
                             "--labels", "4", "--draws", "2", "--measure-rows", "8", "--epochs", "2", "--name", "labels-it"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = json.loads((built.bench_dir / "labels-it.json").read_text())["results"]
    push = written["tasks"]["push"]
    assert push["traffic"]["requests"] == 10 and push["traffic"]["corrected"] == push["traffic"]["rated"] == 0
    assert push["queue_listed"] == 10  # the review queue ranked every answer of the traffic
    assert list(push["arms"]) == ["queue", "random-1", "random-2"]
    for arm in push["arms"].values():
        assert arm["labels"] == 4 and 1 <= arm["distinct_inputs"] <= 4
        assert arm["training"][0]["method"] == "sft" and arm["training"][0]["epochs"] == 2.0
        assert arm["training"][0]["steps"] == 2  # 4 labels, one batch an epoch: the same steps for every arm, no clock
        assert arm["gain"]["n"] == 8 and arm["ci95"][0] <= arm["mean"] <= arm["ci95"][1]
    assert set(push["queue_minus"]) == {"random-1", "random-2"}
    after = {card["id"] for card in httpx.get(f"{engines['base'].url}/v1/models", timeout=30).json()["data"]}
    assert after == before  # every arm unloaded: the engines hold what they held
    table = (built.bench_dir / "labels-it.md").read_text()
    assert "| push | queue | 4 (" in table
    assert "times the random draws' mean" in table or "random labels gained nothing" in table
    assert "2 epochs over its labels, no time budget" in table
