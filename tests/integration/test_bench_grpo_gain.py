"""`tucano bench grpo-gain` end to end on the session's base engine with the tiny models: groups
sampled there without references, a fresh LoRA trained on them per learning rate, loaded under a
fresh name, measured on held-out rows against the base model, then unloaded. A small run: it
checks what was trained and measured, and that the engine is left as it was, not the figures."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx

from tests.conftest import REPO


def _bench(built, engines, *args: str) -> subprocess.CompletedProcess:
    env = {"TUCANO_DATA_DIR": str(built.data_dir), "TUCANO_BASE_ENGINE_URLS": json.dumps([engines["base"].url]),
           "TUCANO_THINK_ENGINE_URL": engines["think"].url, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "cli", "bench", "grpo-gain", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


def test_bench_grpo_gain_trains_each_rate_on_reference_free_groups_and_measures_it_on_held_out_rows(built, engines):
    before = {card["id"] for card in httpx.get(f"{engines['base'].url}/v1/models", timeout=30).json()["data"]}
    result = _bench(built, engines, "--task", "push", "--groups", "4", "--measure-rows", "5", "--lr", "1e-4", "--lr", "1e-3",
                    "--temperature", "0.4", "--temperature", "1.0", "--picks", "--group-size", "4")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = json.loads((built.bench_dir / "grpo-gain-push.json").read_text())["results"]
    assert written["groups"] == 4 and written["group_sizes"] == [4] and written["measure_rows"] == 5
    assert written["base"]["held_out"]["n"] == 5 and 0.0 <= written["greedy_served_on_group_rows"] <= 1.0
    assert written["temperatures"] == [0.4, 1.0]
    # each temperature's groups scored with their train rows' references: no pick beats the best sample
    assert [check["temperature"] for check in written["groups_check"]] == [0.4, 1.0]
    for check in written["groups_check"]:
        assert 0.0 <= check["samples"] <= check["best_sample"] <= 1.0 and check["served_pick"] <= check["best_sample"]
        assert 0 <= check["groups_ranked"] <= 4 and 0.0 <= check["greedy"] <= 1.0
    # every temperature's own groups, each trained at every rate, then SFT on their served picks
    # (skipped, and said so, where too few of the 4 groups varied to pick from)
    grpo = [arm for arm in written["arms"] if arm["method"] == "grpo"]
    assert [(arm["temperature"], arm["learning_rate"]) for arm in grpo] == [(0.4, 1e-4), (0.4, 1e-3), (1.0, 1e-4), (1.0, 1e-3)]
    picks = {arm["temperature"]: arm for arm in written["arms"] if arm["method"] == "sft on picks"}
    skipped = [reason for reason in written["skipped"] if reason.startswith("sft on picks")]
    assert len(picks) + len(skipped) == 2
    for arm in picks.values():
        assert 1 <= arm["picks"] <= 3 and arm["validation"] >= 1 and arm["steps"] >= 1 and arm["gain"]["n"] == 5
    for arm in grpo:
        # 4 groups, 2 a step, each batch optimised twice, one epoch: 4 steps, unless every group was flat
        assert arm["groups_seen"] == 4 and 0 <= arm["groups_dropped"] <= 4
        assert arm["steps"] == 4
        assert arm["gain"]["n"] == 5 and arm["gain"]["ci95"][0] <= arm["gain"]["mean"] <= arm["gain"]["ci95"][1]
        assert abs(arm["held_out"]["mean"] - written["base"]["held_out"]["mean"] - arm["gain"]["mean"]) < 2e-3
        assert arm["reference_free_gain"]["n"] == 5 and 0 <= arm["same_answer_as_base"] <= 5
    after = {card["id"] for card in httpx.get(f"{engines['base'].url}/v1/models", timeout=30).json()["data"]}
    assert after == before  # each arm's LoRA unloaded
    table = (built.bench_dir / "grpo-gain-push.md").read_text()
    # method, temperature, rate, passes, steps: one pass is the default
    assert "| grpo | 0.4 | 4 | 0.0001 | 1 | 4 (" in table and "| grpo | 1 | 4 | 0.001 | 1 | 4 (" in table


def test_bench_grpo_gain_trains_each_number_of_passes_and_group_size_as_an_arm_and_measures_the_gates_rows_too(built, engines):
    result = _bench(built, engines, "--task", "push", "--groups", "4", "--measure-rows", "4", "--lr", "1e-3",
                    "--temperature", "1.0", "--epochs", "1", "--epochs", "2", "--gate-rows", "4", "--group-size", "2", "--group-size", "4")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = json.loads((built.bench_dir / "grpo-gain-push.json").read_text())["results"]
    assert written["epochs"] == [1.0, 2.0] and written["gate_rows"] == 4 and written["base_on_gate_rows"]["n"] == 4
    assert written["group_sizes"] == [2, 4] and [check["group_size"] for check in written["groups_check"]] == [2, 4]
    arms = written["arms"]
    assert [(arm["method"], arm["group_size"], arm["epochs"]) for arm in arms] == [
        ("grpo", 2, 1.0), ("grpo", 2, 2.0), ("grpo", 4, 1.0), ("grpo", 4, 2.0)]
    # 4 groups of either size, 2 a step, each batch optimised twice: 4 steps a pass, and no group
    # left out as one of another size than the arm trains
    assert [arm["steps"] for arm in arms] == [4, 8, 4, 8]
    for arm in arms:
        assert arm["groups_seen"] == 4 * arm["epochs"]  # each pass sees the 4 groups
        gated = arm["gain_on_gate_rows"]
        assert gated["n"] == 4 and gated["ci95"][0] <= gated["mean"] <= gated["ci95"][1]
    table = (built.bench_dir / "grpo-gain-push.md").read_text()
    assert "| grpo | 1 | 2 | 0.001 | 2 | 8 (" in table and "| grpo | 1 | 4 | 0.001 | 2 | 8 (" in table
    assert "On the first 4 rows of the gate's eval split" in table
    few = _bench(built, engines, "--task", "push", "--gate-rows", "2")
    assert few.returncode == 2 and "--gate-rows" in few.stdout + few.stderr


def test_bench_grpo_gain_trains_the_per_field_credit_as_an_arm_beside_the_sum(built, engines):
    """`--advantage fields` on extraction: each sample's field tokens are credited one by one (the
    arm counts them), beside an arm of the sum on the same groups; an advantage GRPO does not have
    is a usage error."""
    result = _bench(built, engines, "--task", "extraction", "--groups", "2", "--measure-rows", "3", "--lr", "1e-3",
                    "--advantage", "sum", "--advantage", "fields")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = json.loads((built.bench_dir / "grpo-gain-extraction.json").read_text())["results"]
    assert written["advantages"] == ["sum", "fields"]
    plain, credited = written["arms"]
    assert (plain["advantage"], credited["advantage"]) == ("sum", "fields")
    assert "field_credit_samples" not in plain
    samples = written["group_sizes"][0] * 2  # 2 groups, one pass
    assert credited["field_credit_samples"] + credited["field_credit_whole"] == samples and credited["field_credit_samples"] > 0
    table = (built.bench_dir / "grpo-gain-extraction.md").read_text()
    assert "| grpo | 0.7 |" in table and "| grpo (fields) | 0.7 |" in table
    bad = _bench(built, engines, "--task", "extraction", "--advantage", "mean")
    assert bad.returncode == 2 and "--advantage" in bad.stdout + bad.stderr


def test_bench_grpo_gain_trains_an_entropy_bonus_as_an_arm_beside_none(built, engines):
    """`--entropy-coef`: the same groups trained with and without TRL's entropy bonus, each its own
    arm; the bonus reaches the loss: the two arms part after the first step, the bonus arm keeping
    more entropy."""
    result = _bench(built, engines, "--task", "push", "--groups", "4", "--measure-rows", "3", "--lr", "1e-3",
                    "--group-size", "4", "--entropy-coef", "0", "--entropy-coef", "0.5")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = json.loads((built.bench_dir / "grpo-gain-push.json").read_text())["results"]
    assert written["entropy_coefs"] == [0.0, 0.5]
    plain, bonus = written["arms"]
    assert (plain["entropy_coef"], bonus["entropy_coef"]) == (0.0, 0.5) and plain["steps"] == bonus["steps"] == 4
    assert plain["kl_to_parent"] != bonus["kl_to_parent"] and bonus["entropy"] > plain["entropy"]
    table = (built.bench_dir / "grpo-gain-push.md").read_text()
    assert "| grpo | 0.7 | 4 | 0.001 |" in table and "| grpo (entropy 0.5) | 0.7 | 4 | 0.001 |" in table


def test_bench_grpo_gain_refuses_a_task_without_references_too_few_groups_and_a_greedy_group(built, engines):
    insights = _bench(built, engines, "--task", "insights")
    assert insights.returncode == 2 and "insights has no references" in insights.stdout + insights.stderr
    few = _bench(built, engines, "--groups", "1")
    assert few.returncode == 2 and "--groups" in few.stdout + few.stderr
    greedy = _bench(built, engines, "--temperature", "0")  # greedy samples would all agree: no group to learn from
    assert greedy.returncode == 2 and "--temperature" in greedy.stdout + greedy.stderr
