"""`tucano bench learn`'s report: what the served reward on held-out rows is made of."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rewards.scoring import Score

REPO = Path(__file__).resolve().parents[2]


def _score(total: float, **components: float) -> Score:
    return Score(total=total, components=components, reference_used=True, valid=True)


def test_measured_gives_the_mean_its_interval_and_each_components_mean():
    from bench.learn import measured

    scores = [_score(0.2, parse=1.0, executes=0.0), _score(0.4, parse=1.0, executes=1.0), _score(0.0, parse=0.0)]
    out = measured(scores)
    assert out["mean"] == pytest.approx(0.2)
    assert out["n"] == 3
    assert out["ci95"][0] <= out["mean"] <= out["ci95"][1]
    # a component a score lacks (an unparsed answer never executes) counts as 0, not as missing
    assert out["components"] == {"executes": pytest.approx(1 / 3, abs=1e-4), "parse": pytest.approx(2 / 3, abs=1e-4)}


def test_measured_shows_each_extraction_field_as_the_gate_compares_them():
    """Extraction's content is one component; the bench reports its fields one by one, as the
    gate's per-field veto sees them, so a field that a round made worse shows in the results."""
    import json

    from bench.learn import measured
    from common.records import RewardContext
    from tasks import score, typed_input

    reference = {"sentiment": "negative", "sentiment_score": 1.0, "complaint_category": "delivery_delay",
                 "product_mentioned": "mochila escolar", "delivery_issue": True, "would_recommend": False, "urgency": "high",
                 "key_phrases": ["ainda não chegou"], "summary": "Pedido atrasado.", "requires_response": True}
    wrong_delivery = {**reference, "delivery_issue": False}
    review = {"review": "A mochila escolar ainda não chegou. Não recomendo."}
    context = RewardContext(typed_input("extraction", review))
    scores = [score("extraction", json.dumps(answer, ensure_ascii=False), reference, context)
              for answer in (reference, wrong_delivery)]
    out = measured(scores)
    assert out["components"]["field:delivery_issue"] == pytest.approx(0.5)
    assert out["components"]["field:product_mentioned"] == pytest.approx(1.0)
    assert out["components"]["content"] == pytest.approx(1 - 0.5 * 0.5 / 10, abs=1e-4)  # delivery_issue weighs 0.5 of 10


def test_a_gain_is_paired_by_held_out_row():
    from bench.learn import paired_gain

    before = [_score(0.1), _score(0.5), _score(0.9)]
    after = [_score(0.2), _score(0.6), _score(1.0)]
    out = paired_gain(after, before)
    assert out["mean"] == pytest.approx(0.1) and out["n"] == 3
    assert out["ci95"] == [pytest.approx(0.1), pytest.approx(0.1)]  # every row gained the same: no spread
    assert paired_gain(before, after)["mean"] == pytest.approx(-0.1)


def test_the_markdown_shows_each_component_before_after_and_for_the_oracle():
    from bench.learn import components_table, table

    results = {
        "settings": {"rounds": 1, "requests": 10, "correction_rate": 0.2, "rating_rate": 0.3, "measure_rows": {"sql": 2, "push": 2}},
        "tasks": {
            "sql": {"rounds": [{"round": 0, "version": "base", "mean": 0.05, "ci95": [0.05, 0.05], "n": 2,
                                "components": {"parse": 0.0, "executes": 0.0}},
                               {"round": 1, "version": "sql-v1", "mean": 0.2, "ci95": [0.1, 0.3], "n": 2,
                                "components": {"parse": 0.9, "executes": 0.05}}],
                    "gain": {"mean": 0.15, "ci95": [0.05, 0.25], "n": 2},
                    "oracle": {"mean": 0.1, "ci95": [0.1, 0.1], "n": 2, "components": {"parse": 0.4, "executes": 0.0},
                               "gain": {"mean": 0.05}, "loop_share": 3.0}},
            "push": {"rounds": [{"round": 0, "version": "base", "mean": 0.6, "ci95": [0.5, 0.7], "n": 2,
                                 "components": {"length": 0.5}},
                                {"round": 1, "version": "base", "mean": 0.6, "ci95": [0.5, 0.7], "n": 2,
                                 "components": {"length": 0.5}}],
                     "gain": {"mean": 0.0, "ci95": [0.0, 0.0], "n": 2}},
        },
        "rounds": [{"round": 1, "seconds": 60.0, "tasks": {}}],
    }
    lines = components_table(results).splitlines()
    assert "| sql | executes | 0.000 | 0.050 | 0.000 |" in lines
    assert "| sql | parse | 0.000 | 0.900 | 0.400 |" in lines
    assert "| push | length | 0.500 | 0.500 | - |" in lines  # no oracle trained
    assert components_table(results) in table(results)


def test_the_as_served_table_gives_each_rounds_version_as_the_gateway_serves_it_and_its_gain():
    from bench.learn import as_served_table, table

    def measurement(number: int, version: str, alone: float, served: float | None) -> dict:
        out = {"round": number, "version": version, "mean": alone, "ci95": [alone, alone], "n": 2, "components": {}}
        if served is not None:
            out["as_served"] = {"mean": served, "ci95": [served, served], "n": 2, "components": {},
                                "gain": {"mean": served - 0.5, "ci95": [served - 0.55, served - 0.45], "n": 2}}
        return out

    results = {"settings": {"rounds": 2, "requests": 10, "correction_rate": 0.2, "rating_rate": 0.3, "measure_rows": {"extraction": 2}},
               "tasks": {"extraction": {"rounds": [measurement(0, "base", 0.5, None), measurement(1, "base", 0.5, 0.7),
                                                   measurement(2, "extraction-v2", 0.55, 0.72)],
                                        "gain": {"mean": 0.05, "ci95": [0.0, 0.1], "n": 2}}},
               "rounds": [{"round": 1, "seconds": 60.0, "tasks": {}}, {"round": 2, "seconds": 60.0, "tasks": {}}]}
    lines = as_served_table(results).splitlines()
    assert "| round 1 | round 2 | gain" in lines[0]
    assert lines[2] == "| extraction | 0.700 | 0.720 | +0.220 [+0.170, +0.270] |"
    results["tasks"]["extraction"]["rounds"][2]["as_served"]["examples"] = False  # its gate chose to serve it alone
    assert as_served_table(results).splitlines()[2] == "| extraction | 0.700 | 0.720 alone | +0.220 [+0.170, +0.270] |"
    assert as_served_table(results) in table(results)
    for entry in results["tasks"]["extraction"]["rounds"]:  # a run from before this measurement: no such table
        entry.pop("as_served", None)
    assert "as served" not in table(results)


def test_the_ablation_sets_grpos_learning_rate_beside_the_supervised_one():
    from bench.learn import ABLATION_ARMS, table

    def arm(mean: float, rate: float, gain: float) -> dict:
        return {"mean": mean, "ci95": [mean, mean], "n": 2, "learning_rate": rate, "steps": 5,
                "gain_over_start": {"mean": gain, "ci95": [gain - 0.05, gain + 0.05], "n": 2}}

    ablation = {"task": "push", "prompts": 40, "start": "base", "sum": arm(0.30, 3e-4, 0.05), "gdpo": arm(0.28, 3e-4, 0.03),
                "sum at the supervised rate": arm(0.15, 3e-3, -0.10), "gdpo_minus_sum": {"mean": -0.02, "ci95": [-0.05, 0.01]},
                "start_measured": {"mean": 0.25, "ci95": [0.2, 0.3], "n": 2}}
    results = {"settings": {"rounds": 0, "requests": 10, "correction_rate": 0.0, "rating_rate": 0.0, "measure_rows": {}},
               "tasks": {}, "rounds": [], "ablation": [ablation]}
    lines = table(results).splitlines()
    assert "| sum at the supervised rate | 0.003 | 5 | 0.150 | -0.100 [-0.150, -0.050] |" in lines
    assert "| sum | 0.0003 | 5 | 0.300 | +0.050 [+0.000, +0.100] |" in lines
    assert [arm for arm, _ in ABLATION_ARMS] == ["sum", "gdpo", "sum at the supervised rate"]
    del ablation["start_measured"]  # a run from before the learning rates were compared: its one line only
    assert not any(line.startswith("| sum") for line in table(results).splitlines())


def test_the_rounds_table_says_when_a_look_stopped_the_gate_early():
    from bench.learn import table

    traffic = {"requests": 10, "corrected": 2, "rated": 3}
    early = {"difference": 0.3, "interval": [0.2, 0.4], "n": 32, "planned": 64}
    full = {"difference": 0.01, "interval": [-0.02, 0.04], "n": 64, "planned": 64}
    before_looks = {"difference": 0.01, "interval": [-0.02, 0.04], "n": 24}  # a decision stored before `planned` existed
    results = {
        "settings": {"rounds": 1, "requests": 10, "correction_rate": 0.2, "rating_rate": 0.3, "measure_rows": {}},
        "tasks": {},
        "rounds": [{"round": 1, "seconds": 60.0, "tasks": {
            "sql": {"traffic": traffic, "outcome": "promoted", "seconds": {"gate": 9.0}, "decision": early},
            "push": {"traffic": traffic, "outcome": "rejected", "seconds": {"gate": 20.0}, "decision": full},
            "insights": {"traffic": traffic, "outcome": "rejected", "decision": before_looks},
            "extraction": {"traffic": traffic, "outcome": "not trained", "reason": "nothing new"}}}],
    }
    rows = {line.split(" | ")[1]: line for line in table(results).splitlines() if line.startswith("| 1 | ")}
    assert rows["sql"].endswith("+0.300 [+0.200, +0.400] n=32 of 64 |")
    assert rows["push"].endswith("n=64 |") and rows["insights"].endswith("n=24 |") and rows["extraction"].endswith("| - |")


def test_the_rounds_table_gives_the_gates_judgment_without_the_examples_where_it_made_one():
    from bench.learn import table

    traffic = {"requests": 10, "corrected": 2, "rated": 3}
    alone = {"difference": 0.12, "interval": [0.05, 0.2], "n": 32, "planned": 64}
    served_alone = {"difference": -0.005, "interval": [-0.02, 0.01], "n": 64, "planned": 64, "alone": alone, "served_alone": True}
    not_alone = {**served_alone, "alone": {**alone, "interval": [-0.01, 0.2], "n": 64}, "served_alone": False}
    results = {
        "settings": {"rounds": 1, "requests": 10, "correction_rate": 0.2, "rating_rate": 0.3, "measure_rows": {}},
        "tasks": {},
        "rounds": [{"round": 1, "seconds": 60.0, "tasks": {
            "extraction": {"traffic": traffic, "outcome": "promoted", "decision": served_alone},
            "sql": {"traffic": traffic, "outcome": "rejected", "decision": not_alone}}}],
    }
    rows = {line.split(" | ")[1]: line for line in table(results).splitlines() if line.startswith("| 1 | ")}
    assert rows["extraction"].endswith("-0.005 [-0.020, +0.010] n=64; alone +0.120 [+0.050, +0.200] n=32, served alone |")
    assert rows["sql"].endswith("; alone +0.120 [-0.010, +0.200] n=64 |")


def test_the_rounds_table_says_how_many_steps_each_method_ran_and_where_it_started():
    from bench.learn import trained

    entry = {"plan": [{"method": "sft", "why": "23 supervised examples"}], "start": {"weights": "base", "why": "no active version"},
             "training": [{"method": "sft", "steps": 26, "epochs": 6.5, "stopped_by": "time budget"}]}
    assert trained(entry) == "sft 26 steps, 6.5 epochs (time budget), from base"
    two = {**entry, "start": {"weights": "active"}, "training": [{"method": "sft", "steps": 8, "epochs": 1.0, "stopped_by": "epochs"},
                                                             {"method": "dpo", "steps": 3, "epochs": 0.5, "stopped_by": "time budget"}]}
    assert trained(two) == "sft 8 steps, 1 epochs (epochs) + dpo 3 steps, 0.5 epochs (time budget), from active"
    # results kept before the training was recorded name the plan's methods; an untrained task a dash
    assert trained({"plan": [{"method": "sft"}, {"method": "dpo"}]}) == "sft+dpo"
    assert trained({"outcome": "not trained", "plan": []}) == "-"


def test_the_label_curve_takes_each_input_once_in_the_order_it_was_first_sent():
    from bench.learn import distinct

    sent = [{"id": "b", "n": 1}, {"id": "a", "n": 2}, {"id": "b", "n": 3}, {"id": "c", "n": 4}]
    assert [(r["id"], r["n"]) for r in distinct(sent)] == [("b", 1), ("a", 2), ("c", 4)]
    assert distinct(sent)[:2] == distinct(sent[:2])  # the first K of the curve are the first K sent


def test_the_label_curve_is_reported_per_task_and_point():
    from bench.learn import label_curve_table

    results = {"tasks": {"sql": {"label_curve": [
        {"labels": 24, "mean": 0.2, "ci95": [0.18, 0.22], "gain": {"mean": 0.15, "ci95": [0.13, 0.17]}, "components": {"parse": 0.9}},
        {"labels": 72, "mean": 0.21, "ci95": [0.19, 0.23], "gain": {"mean": 0.16, "ci95": [0.14, 0.18]}, "components": {"parse": 0.95}}]},
        "push": {}}}
    lines = label_curve_table(results).splitlines()
    assert lines[2] == "| sql | 24 | 0.200 [0.180, 0.220] | +0.150 [+0.130, +0.170] | parse 0.90 |"
    assert lines[3].startswith("| sql | 72 | 0.210")
    assert len(lines) == 4  # push has no curve


def test_a_label_curve_point_below_two_references_is_refused(tmp_path):
    refused = subprocess.run([sys.executable, "-m", "cli", "bench", "learn", "--label-curve", "1"], cwd=REPO,
                             capture_output=True, text=True, timeout=120, env={**os.environ, "TUCANO_DATA_DIR": str(tmp_path), "COLUMNS": "300"})
    assert refused.returncode == 2
    assert "--label-curve" in refused.stderr and "greater than or equal to 2" in refused.stderr
    assert not (tmp_path / "bench").exists()  # nothing was run or written


def test_each_target_is_judged_from_the_measurements():
    from bench.learn import targets, targets_table

    def rounds(*means, components=None, against=None):
        out = [{"round": i, "version": "base" if i == 0 else f"v{i}", "mean": m, "ci95": [m, m], "n": 2,
                "components": (components or [{}] * len(means))[i]} for i, m in enumerate(means)]
        if against:
            out[-1]["against_previous"] = {"previous": "v1", **against}
        return out

    results = {"tasks": {
        "sql": {"rounds": rounds(0.15, 0.6, components=[{"execution_match": 0.03}, {"execution_match": 0.6}]),
                "gain": {"mean": 0.45, "ci95": [0.35, 0.55]},
                "oracle": {"gain": {"mean": 0.5}, "loop_share": 0.9}},
        "extraction": {"rounds": rounds(0.58, 0.6, 0.62, against={"mean": -0.04, "ci95": [-0.07, -0.01]}),
                       "gain": {"mean": 0.04, "ci95": [0.01, 0.07]}, "oracle": {"gain": {"mean": 0.2}, "loop_share": 0.2}},
        "insights": {"rounds": rounds(0.75, 0.75), "gain": {"mean": 0.0, "ci95": [0.0, 0.0]}, "oracle": {"gain": {"mean": -0.01}, "loop_share": None}},
    }, "rounds": [{"round": 1, "seconds": 280.0}, {"round": 2, "seconds": 320.5}]}
    verdicts = {t["target"]: t["met"] for t in targets(results)}
    assert verdicts["sql: served reward +0.10 after the rounds, interval above 0"]
    assert verdicts["sql: execution match on held-out rows +0.15"]
    assert verdicts["sql: the loop reaches 0.5 of the oracle's gain"]
    assert not verdicts["extraction: served reward +0.10 after the rounds, interval above 0"]
    assert not verdicts["extraction: the loop reaches 0.5 of the oracle's gain"]
    assert not verdicts["extraction: v2 no worse than v1 (round 2)"]  # its whole interval is below 0
    assert not any(k.startswith("insights: served") or k.startswith("insights: the loop") for k in verdicts)  # no structured target, no oracle gain
    assert verdicts["round 1 under 300 s"] and not verdicts["round 2 under 300 s"]
    assert "| round 2 under 300 s | 320.5 s | missed |" in targets_table(results).splitlines()
    assert not any("as served" in k for k in verdicts)  # a run without that measurement has no such target

    results["tasks"]["extraction"]["rounds"][-1]["as_served"] = {"gain": {"mean": 0.12, "ci95": [0.08, 0.16]}}
    results["tasks"]["sql"]["rounds"][-1]["as_served"] = {"gain": {"mean": 0.12, "ci95": [-0.01, 0.25]}}
    verdicts = {t["target"]: t["met"] for t in targets(results)}
    assert verdicts["extraction: as served +0.10 after the rounds, interval above 0"]
    assert not verdicts["sql: as served +0.10 after the rounds, interval above 0"]  # its interval reaches 0


def _gateway(*responses):
    """An httpx client whose gateway answers `responses` (status, body) in turn, and the requests it saw."""
    import httpx

    seen, replies = [], list(responses)

    def handle(request):
        seen.append(request)
        status, body = replies.pop(0)
        return httpx.Response(status, json=body, headers={"Retry-After": "0"} if status == 503 else None)

    return httpx.AsyncClient(transport=httpx.MockTransport(handle)), seen


def test_the_team_sends_a_503_again_after_its_retry_after_and_a_504_at_once_and_reports_them():
    import asyncio

    from bench.learn import post_as_a_client

    unavailable: list[str] = []
    busy = {"error": {"message": "think engine failed: TimeoutError"}}
    client, seen = _gateway((503, busy), (503, busy), (200, {"id": "r1"}))
    answer = asyncio.run(post_as_a_client(client, "http://gateway/v1/tasks/insights", {"input": {}}, unavailable))
    assert answer == {"id": "r1"}
    assert len(seen) == 3
    assert len(unavailable) == 2 and unavailable[0].startswith("HTTP 503: ") and "think engine failed: TimeoutError" in unavailable[0]

    unavailable = []
    slow = {"error": {"type": "engine_timeout", "message": "the think engine did not answer within 120 s"}}
    client, seen = _gateway((504, slow), (200, {"id": "r2"}))
    assert asyncio.run(post_as_a_client(client, "http://gateway/v1/tasks/insights", {"input": {}}, unavailable)) == {"id": "r2"}
    assert len(seen) == 2 and unavailable[0].startswith("HTTP 504: ") and "did not answer within 120 s" in unavailable[0]


def test_the_team_stops_on_a_503_or_504_every_time_or_on_any_other_error_with_the_gateways_message():
    import asyncio

    from bench.learn import TRIES, TrafficFailed, post_as_a_client

    down = {"error": {"message": "no healthy think engine"}}
    client, seen = _gateway(*[(503, down)] * TRIES)
    with pytest.raises(TrafficFailed, match=rf"HTTP 503 on try {TRIES} of {TRIES}: .*no healthy think engine"):
        asyncio.run(post_as_a_client(client, "http://gateway/v1/tasks/insights", {"input": {}}, []))
    assert len(seen) == TRIES

    slow = {"error": {"message": "the think engine did not answer within 120 s"}}
    client, seen = _gateway(*[(504, slow)] * TRIES)
    with pytest.raises(TrafficFailed, match=rf"HTTP 504 on try {TRIES} of {TRIES}: .*did not answer within 120 s"):
        asyncio.run(post_as_a_client(client, "http://gateway/v1/tasks/insights", {"input": {}}, []))
    assert len(seen) == TRIES

    unavailable: list[str] = []
    client, seen = _gateway((422, {"error": {"message": "input.review: field required"}}))
    with pytest.raises(TrafficFailed, match=rf"HTTP 422 on try 1 of {TRIES}: .*field required"):
        asyncio.run(post_as_a_client(client, "http://gateway/v1/feedback", {"id": "x"}, unavailable))
    assert len(seen) == 1 and unavailable == []  # a client error is never sent again


def test_the_traffic_says_how_long_answers_ran_and_how_many_hit_the_token_limit():
    from bench.learn import answer_shape
    from tasks import definition

    limit = definition("insights").sampling.max_tokens
    answers = [{"usage": {"completion_tokens": t}, "latency_ms": 1000.0 * s}
               for t, s in [(100, 4.0), (120, 5.0), (140, 6.0), (limit, 90.0)] + [(110, 4.5)] * 16]
    shape = answer_shape("insights", answers)
    assert shape["answer_tokens"] == {"p50": 110, "p95": limit, "max": limit}
    assert shape["at_token_limit"] == 1
    assert shape["latency_s"] == {"p50": 4.5, "p95": 90.0, "max": 90.0}
    # a best-of-4 answer is billed its four samples' tokens (run 48 counted 145 of 150 such answers "at the limit")
    grouped = [{"usage": {"completion_tokens": 4 * 110}, "latency_ms": 4000.0, "sample": {"chosen": 0, "of": 4, "totals": [0.5] * 4, "cut": 0}},
               {"usage": {"completion_tokens": 2 * limit + 2 * 90}, "latency_ms": 4000.0, "sample": {"chosen": 1, "of": 2, "totals": [0.5] * 2, "cut": 2}},
               {"usage": {"completion_tokens": 4 * limit}, "latency_ms": 4000.0, "sample": {"chosen": 1, "of": 4, "totals": [0.5] * 4, "cut": 0}}]
    shape = answer_shape("insights", grouped)
    assert shape["answer_tokens"]["p50"] == round((2 * limit + 180) / 4) and shape["answer_tokens"]["max"] == limit
    assert shape["at_token_limit"] == 1


def test_a_run_keeps_its_rounds_after_each_and_its_logs_when_it_fails(tmp_path):
    import json

    from bench.learn import keep_what_ran

    keep, scratch = tmp_path / "bench" / "learn-run9", tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "vllm-think.log").write_text("engine died\n")
    (scratch / "gateway.log").write_text("503\n")
    one_round = {"tasks": {"sql": {"gain": {"mean": 0.2}}}, "rounds": [{"round": 1}]}

    partial = keep_what_ran(keep, one_round)
    assert partial == tmp_path / "bench" / "learn-run9.partial.json"
    kept = json.loads(partial.read_text())
    assert kept == {"rounds_done": 1, "results": one_round}
    assert not (tmp_path / "bench" / "learn-run9-logs").exists()  # a run still going keeps no logs

    two_rounds = {**one_round, "rounds": [{"round": 1}, {"round": 2}]}
    failures = [{"task": "insights", "engine_kind": "think", "error": "think engine http://127.0.0.1:1 failed: timeout"}]
    keep_what_ran(keep, two_rounds, scratch, RuntimeError("HTTP 503 on /v1/tasks/insights"), failures)
    kept = json.loads(partial.read_text())
    assert kept["rounds_done"] == 2 and kept["error"] == "RuntimeError: HTTP 503 on /v1/tasks/insights"
    assert kept["engine_failures"] == failures
    logs = tmp_path / "bench" / "learn-run9-logs"
    assert kept["logs"] == str(logs)
    assert (logs / "vllm-think.log").read_text() == "engine died\n" and (logs / "gateway.log").read_text() == "503\n"
    assert sorted(p.name for p in (tmp_path / "bench").iterdir()) == ["learn-run9-logs", "learn-run9.partial.json"]  # no temporary file left


def test_a_run_keeps_each_measured_versions_answers_beside_their_references(tmp_path):
    """One line per held-out row and measured version, appended round after round; a row without a
    served score (no reference) says None rather than passing for 0."""
    import json

    from bench.learn import answers_path, keep_answers

    path = answers_path(tmp_path / "bench" / "run63")
    assert path == tmp_path / "bench" / "run63.answers.jsonl"
    rows = [{"id": "push-test-1", "input": {"campaign": "cupom"}, "reference": {"title": "Oi", "body": "Use o cupom X"}},
            {"id": "push-test-2", "input": {"campaign": "cupom"}}]
    scored = [Score(0.6, {"intent": 1.0}, True, True, output={"title": "Oi", "body": "cupom X"}),
              Score(0.1, {"intent": 0.0}, False, True, output={"title": "Oi", "body": "..."})]
    free = [Score(0.7, {"intent": 1.0}, False, True), None]
    assert keep_answers(path, "push", 0, "base", rows, scored, free) == 2
    assert keep_answers(path, "push", 1, "push-v1", rows[:1], scored[:1], []) == 1  # no served scores were taken
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["round"], line["version"], line["id"]) for line in lines] == \
        [(0, "base", "push-test-1"), (0, "base", "push-test-2"), (1, "push-v1", "push-test-1")]
    assert lines[0]["answer"] == {"title": "Oi", "body": "cupom X"} and lines[0]["reference"] == rows[0]["reference"]
    assert (lines[0]["score"], lines[0]["served_score"], lines[0]["served_components"]) == (0.6, 0.7, {"intent": 1.0})
    assert lines[1]["reference"] is None and lines[1]["served_score"] is None
    assert lines[2]["served_score"] is None and lines[2]["score"] == 0.6
    with pytest.raises(ValueError, match="2 rows, 2 scores and 1 served scores"):  # refused, not written as None
        keep_answers(path, "push", 2, "push-v2", rows, scored, free[:1])
    assert len(path.read_text().splitlines()) == 3  # nothing of the refused call was written


def test_a_failed_run_reads_the_gateways_engine_failures_from_its_store():
    """What the gateway recorded behind its 503s comes back newest first; a store that cannot be
    read says so instead of passing for a run without failures."""
    import redis

    from bench.learn import FAILURES_KEPT, engine_failures

    class Recorded:
        def recent_failures(self, count):
            assert count == FAILURES_KEPT
            return [{"error": "think engine timed out"}]

    class Gone:
        def recent_failures(self, count):
            raise redis.ConnectionError("Connection refused")

    assert engine_failures(Recorded()) == [{"error": "think engine timed out"}]
    assert engine_failures(None) == []
    [gone] = engine_failures(Gone())
    assert "could not be read" in gone["error"] and "Connection refused" in gone["error"]


def test_bench_fix_tables_each_state_and_the_time_to_fix():
    from bench import fix

    state = {"mean": 0.5, "ci95": [0.4, 0.6], "n": 40}
    gained = {**state, "gain": {"mean": 0.2, "ci95": [0.1, 0.3], "n": 40}}
    results = {"tasks": {"sql": {"before": state, "at once": gained, "after the round": gained, "both": gained,
                                 "repeats": {"corrections": 30, "answered_from_correction": 30, "repeats_better": 27,
                                             "seconds_to_better": {"mean": 1.4, "ci95": [1.2, 1.6], "n": 27}},
                                 "round": {"outcome": "promoted", "seconds": 300.0}}}}
    lines = fix.table(results).splitlines()
    assert lines[2] == "| sql | before | 0.500 [0.400, 0.600] | - |"
    assert lines[3] == "| sql | at once | 0.500 [0.400, 0.600] | +0.200 [+0.100, +0.300] |"
    assert lines[-1] == "| sql | 30 | 30 | 27 | 1.40 [1.20, 1.60] | promoted in 300.0 s |"


def test_labels_per_gain_counts_every_rounds_labels_against_the_gain():
    from bench.learn import labels_per_gain

    traffic = {"corrected": 12, "rated": 18}
    results = {"settings": {"label_choice": "queue"}, "rounds": [{"tasks": {"sql": {"traffic": traffic}}}] * 2,
               "tasks": {"sql": {"gain": {"mean": 0.2}}, "push": {"gain": {"mean": -0.01}}}}
    assert labels_per_gain(results) == {"sql": "60 labels chosen by queue, gain +0.200: 3.0 labels per +0.01"}
    results["rounds"] = [{"tasks": {"sql": {"traffic": traffic}, "push": {"traffic": traffic}}}]
    assert labels_per_gain(results)["push"].endswith("no gain")


def test_the_scorer_check_ranks_the_served_score_against_the_references_and_says_when_it_cannot():
    """Issue 64: the served score GRPO trains on must keep ranking a version's held-out answers as
    their references do; its mean beside the reference-scored one shows a policy that pleases it."""
    from bench.learn import scorer_check, scorer_table

    referenced = [_score(x) for x in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)]
    agreeing = scorer_check([_score(x) for x in (0.2, 0.25, 0.5, 0.55, 0.7, 0.9)], referenced)
    assert agreeing["rank_correlation"] == pytest.approx(1.0) and agreeing["n"] == 6
    assert agreeing["served_mean"] == pytest.approx(0.5167, abs=1e-4) and agreeing["tied"] == 1
    reversed_ = scorer_check([_score(x) for x in (0.9, 0.7, 0.55, 0.5, 0.25, 0.2)], referenced)
    assert reversed_["rank_correlation"] == pytest.approx(-1.0) and reversed_["ci95"][1] <= -0.9
    assert scorer_check([None] * 6, referenced) is None  # no reference-free score taken: a task without references
    flat = scorer_check([_score(0.5)] * 6, referenced)
    assert flat["rank_correlation"] is None and flat["ci95"] is None and flat["tied"] == 6
    # a correlation defined, but undefined in too many resamples for an interval (run 38 crashed on it)
    nearly_flat = scorer_check([_score(x) for x in (0.5, 0.5, 0.5, 0.5, 0.5, 0.9)], referenced)
    assert nearly_flat["rank_correlation"] is not None and nearly_flat["ci95"] is None and nearly_flat["tied"] == 5
    results = {"tasks": {"sql": {"rounds": [{"round": 0, "version": "base", "mean": 0.35, "scorer": agreeing},
                                            {"round": 1, "version": "sql-v1", "mean": 0.35, "scorer": flat},
                                            {"round": 2, "version": "sql-v2", "mean": 0.35, "scorer": nearly_flat}]}}}
    text = scorer_table(results)
    assert "| sql | 0 | base | 1.000 [1.000, 1.000] | 1 of 6 | - | - | 0.517 | 0.350 |" in text
    assert "| sql | 1 | sql-v1 | - | 6 of 6 | - | - | 0.500 | 0.350 |" in text
    assert (f"| sql | 2 | sql-v2 | {nearly_flat['rank_correlation']:.3f} (no interval: undefined in too many resamples) | 5 of 6 "
            "| - | - | 0.567 | 0.350 |") in text


def test_the_scorer_check_over_every_sample_of_a_group_is_not_the_picks_and_resamples_whole_groups():
    """A best-of-n pick is the sample the served score liked best, so the picks alone can rank
    worse than the samples GRPO trains on. Over every sample: the pooled rank correlation, and the
    mean of each group's own rank correlation."""
    from bench.learn import samples_check, scorer_check, scorer_table, within_group_rhos

    # each group: (served, reference) per sample; within a group the served score orders its samples as the references do
    groups = [[(0.1 + g / 10, 0.05 + g / 10), (0.3 + g / 10, 0.2 + g / 10), (0.5 + g / 10, 0.6 + g / 10)] for g in range(8)]
    check = samples_check(groups)
    assert check["samples"] == 24 and check["groups"] == 8
    assert check["within_group"] == {"mean": 1.0, "ci95": [1.0, 1.0], "groups": 8}
    assert 0.8 < check["rank_correlation"] < 1.0 and check["ci95"][0] <= check["rank_correlation"] <= check["ci95"][1]
    # reversed within each group while the groups' levels agree: the pooled rank correlation hides what GRPO sees
    reversed_within = [[(g + 0.3, g + 0.1), (g + 0.2, g + 0.2), (g + 0.1, g + 0.3)] for g in range(8)]
    check_reversed = samples_check(reversed_within)
    assert check_reversed["rank_correlation"] > 0.9 and check_reversed["within_group"]["mean"] == -1.0
    # a group tied on either side ranks nothing and is left out of the mean
    assert samples_check([[(0.1, 0.5), (0.9, 0.5)], [(0.1, 0.2), (0.9, 0.7)]])["within_group"] is None  # one group ranked
    assert within_group_rhos([[(0.1, 0.5), (0.9, 0.5)], [(0.1, 0.2), (0.9, 0.7)], [(0.2, 0.1), (0.2, 0.9)]]) == [pytest.approx(1.0)]
    assert samples_check([[(0.1, 0.5)], [(0.2, 0.6)]]) is None  # greedy: groups of one, the picks are all there is
    assert samples_check([]) is None
    picks = [_score(max(g)[0]) for g in groups]
    referenced = [_score(max(g)[1]) for g in groups]
    check = scorer_check(picks, referenced, groups)
    assert check["over_samples"]["samples"] == 24 and check["rank_correlation"] == pytest.approx(1.0)
    assert "over_samples" not in scorer_check(picks, referenced, [[pair] for pair in map(max, groups)])
    text = scorer_table({"tasks": {"extraction": {"rounds": [{"round": 0, "version": "base", "mean": 0.6, "scorer": check}]}}})
    over = check["over_samples"]
    assert (f"| extraction | 0 | base | 1.000 [1.000, 1.000] | 1 of 8 | {over['rank_correlation']:.3f} [{over['ci95'][0]:.3f}, "
            f"{over['ci95'][1]:.3f}] (24) | 1.000 [1.000, 1.000] (8) |") in text


def test_learning_from_traffic_alone_is_judged_on_two_structured_tasks_and_the_scorer_it_pleases():
    from bench.learn import targets

    def task(gain, low, high, free_first=None, free_last=None, rhos=(0.9, 0.8)):
        rounds = [{"round": i, "version": "base" if i == 0 else f"v{i}", "mean": 0.3, "ci95": [0.3, 0.3], "n": 40, "components": {}}
                  for i in range(len(rhos))]
        if free_first is not None:
            for r, free, rho in zip(rounds, (free_first, free_last), rhos):
                r["scorer"] = {"rank_correlation": rho, "ci95": [rho, rho], "n": 40, "served_mean": free}
        return {"rounds": rounds, "gain": {"mean": gain, "ci95": [low, high]}}

    results = {"settings": {"correction_rate": 0.0, "rating_rate": 0.0}, "rounds": [], "tasks": {
        "sql": task(0.08, 0.02, 0.14, 0.40, 0.50), "push": task(0.06, 0.01, 0.11, 0.30, 0.45, rhos=(0.8, 0.65)),
        "extraction": task(-0.03, -0.06, -0.01)}}
    verdicts = {t["target"]: (t["met"], t["measured"]) for t in targets(results)}
    assert verdicts["from traffic alone: +0.05 with the interval above 0 on at least 2 structured tasks"] == (True, "sql, push")
    assert not verdicts["extraction: not lower after the rounds from traffic alone"][0]
    assert verdicts["sql: reference-free gain at most 0.05 above the reference-scored gain"][0]  # +0.10 against +0.08
    assert not verdicts["push: reference-free gain at most 0.05 above the reference-scored gain"][0]  # +0.15 against +0.06
    assert verdicts["push: reference-free gain at most 0.05 above the reference-scored gain"][1] == "+0.150 against +0.060"
    for r, part in zip(results["tasks"]["push"]["rounds"], (0.156, 0.161)):  # the overlap's part moved little
        r["scorer"].update(reference_only=["reference_overlap"], reference_only_mean=part)
    verdicts = {t["target"]: (t["met"], t["measured"]) for t in targets(results)}
    assert verdicts["push: reference-free gain at most 0.05 above the reference-scored gain"] == (
        False, "+0.150 against +0.060; the part only a reference scores (reference_overlap) +0.005")
    assert not verdicts["push: the served score's rank correlation with the references at least 0.7"][0]
    assert verdicts["sql: the served score's rank correlation with the references at least 0.7"] == (True, "0.90, 0.80")
    labelled = {**results, "settings": {"correction_rate": 0.2, "rating_rate": 0.3}}
    assert not any("traffic alone" in t["target"] for t in targets(labelled))  # a run with labels is judged by the others


def test_the_scorer_check_reads_the_part_only_a_reference_scores_which_explains_pushs_lead():
    """Push scored with a reference is 0.65 of its served components plus 0.35 of its overlap with
    the reference copy: the check reports that part, and an answer's reference-scored total is the
    served one scaled by 0.65 plus it (to the totals' rounding), so a served gain the overlap does
    not follow runs ahead by 0.35 of it."""
    import json

    from bench.learn import scorer_check
    from tasks import score
    from tests.unit.conftest import ctx

    context = ctx("push", campaign="cupom", customer_name="Ana", product="mochila", discount_pct=15, coupon="VOLTA10")
    reference = {"title": "Ana, tem cupom pra você", "body": "15% off em mochila. Use o cupom VOLTA10 e aproveite."}
    answers = [reference, {"title": "Ana, cupom novo", "body": "Mochila com 15% off. Use VOLTA10 hoje."},
               {"title": "Oferta", "body": "Confira as novidades da loja."}, {"title": "Ana", "body": "Mochila mochila."}]
    texts = [json.dumps(a, ensure_ascii=False) for a in answers]
    scored = [score("push", t, reference, context) for t in texts]
    free = [score("push", t, None, context) for t in texts]
    check = scorer_check(free, scored)
    assert check["reference_only"] == ["reference_overlap"]
    parts = [0.35 * s.components["reference_overlap"] for s in scored]
    assert check["reference_only_mean"] == pytest.approx(sum(parts) / len(parts), abs=1e-4)
    for s, f, part in zip(scored, free, parts):
        assert s.total == pytest.approx(0.65 * f.total + part, abs=2e-4)
    # a task whose reference score has nothing of its own reports nothing
    assert "reference_only" not in scorer_check(free, free)
