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
    result = subprocess.run([sys.executable, "-m", "cli", "bench", "labels", "--task", "push", "--requests", "10",
                             "--labels", "8", "--draws", "2", "--measure-rows", "8", "--epochs", "2", "--trainings", "2",
                             "--name", "labels-it"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = json.loads((built.bench_dir / "labels-it.json").read_text())["results"]
    push = written["tasks"]["push"]
    assert push["traffic"]["requests"] == 10 and push["traffic"]["corrected"] == push["traffic"]["rated"] == 0
    assert push["queue_listed"] == 10  # the review queue ranked every answer of the traffic
    assert len(push["held_out"]) == 8 and all(rid.startswith("push-test-") for rid in push["held_out"])
    assert len(push["base"]["totals"]) == 8 and abs(sum(push["base"]["totals"]) / 8 - push["base"]["mean"]) < 1e-3
    assert list(push["arms"]) == ["queue", "random-1", "random-2"]
    for arm in push["arms"].values():
        assert arm["labels"] == 8 and 1 <= arm["distinct_inputs"] <= 8 and len(arm["chosen"]) == 8
        assert len(set(arm["chosen"])) == arm["distinct_inputs"] and all(rid.startswith("push-train-") for rid in arm["chosen"])
        training = arm["training"][0]
        assert training["method"] == "sft" and training["epochs"] == 2.0 and training["stopped_by"] == "epochs"
        assert training["examples"] == 8  # every label trains: no validation slice (a round holds out 4 of 8)
        assert training["steps"] == 2  # 8 labels, one batch an epoch: the same steps for every arm, no clock
        assert arm["gain"]["n"] == 8 and arm["ci95"][0] <= arm["mean"] <= arm["ci95"][1]
        assert len(arm["totals"]) == 8 and abs(sum(arm["totals"]) / 8 - arm["mean"]) < 1e-3  # row by row, the same rows as the base's
        first, second = arm["trainings"]  # two trainings of the same labels, from consecutive seeds, each its own version
        assert second["training_seed"] == first["training_seed"] + 1 and first["version"] != second["version"]
        assert arm["totals"] == [round((a + b) / 2, 4) for a, b in zip(first["totals"], second["totals"])]
    assert set(push["queue_minus"]) == {"random-1", "random-2"}
    after = {card["id"] for card in httpx.get(f"{engines['base'].url}/v1/models", timeout=30).json()["data"]}
    assert after == before  # every arm unloaded: the engines hold what they held
    table = (built.bench_dir / "labels-it.md").read_text()
    assert "| push | queue | 8 (" in table
    assert "times the random draws' mean" in table or "random labels gained nothing" in table
    assert "2 epochs over all its labels (no validation slice), no time budget, trained 2 times" in table
