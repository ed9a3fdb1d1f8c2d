"""`tucano bench peers`' own parts: the mock engine (a real server on a loopback port: every
route the gateway and the peers use, streaming and not, its delay, its errors), the statistics
(histogram quantiles, block intervals, verdicts), the profile summary, and the bodies each side
gets for the same review."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from common.processes import free_port
from common.records import RewardContext
from common.tasks import ExtractionInput
from tests.conftest import REPO


@pytest.fixture(scope="module")
def mock_engine():
    def start(delay_ms: float) -> tuple[subprocess.Popen, str]:
        port = free_port()
        process = subprocess.Popen([sys.executable, "-c", "import sys; from bench.mock_engine import serve; serve(*sys.argv[1:])",
                                    str(port), str(delay_ms)], cwd=REPO)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    return process, url
            except httpx.HTTPError:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.05)

    started = {delay: start(delay) for delay in (0, 150)}
    yield {delay: url for delay, (_, url) in started.items()}
    for process, _ in started.values():
        process.terminate()
        process.wait(10)


def test_the_mock_answers_chat_and_completions_with_a_valid_extraction_answer(mock_engine):
    from bench.mock_engine import COMPLETION
    from tasks import score

    url = mock_engine[0]
    with httpx.Client() as client:  # one keep-alive connection for every request
        chat = client.post(f"{url}/v1/chat/completions", json={"model": "mock", "messages": [{"role": "user", "content": "oi"}]}).json()
        text = client.post(f"{url}/v1/completions", json={"model": "mock", "prompt": "oi"}).json()
        listed = client.get(f"{url}/v1/models").json()
        missing = client.get(f"{url}/v1/nothing")
    assert chat["choices"][0]["message"]["content"] == COMPLETION == text["choices"][0]["text"]
    assert chat["usage"]["completion_tokens"] > 0 and text["object"] == "text_completion"
    assert listed["data"][0]["id"] == "mock" and listed["data"][0]["parent"] is None
    assert missing.status_code == 404
    late = ExtractionInput(review="O fone de ouvido chegou com a entrega atrasada.")
    assert score("extraction", COMPLETION, None, RewardContext(late)).components["schema"] > 0


@pytest.mark.parametrize("path,field", [("/v1/chat/completions", "delta"), ("/v1/completions", "text")])
def test_the_mock_streams_server_sent_events_that_add_up_to_the_completion(mock_engine, path, field):
    from bench.mock_engine import COMPLETION

    with httpx.stream("POST", f"{mock_engine[0]}{path}", json={"model": "mock", "prompt": "oi", "stream": True}) as response:
        assert response.headers["content-type"] == "text/event-stream"
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join((c["choices"][0]["delta"]["content"] if field == "delta" else c["choices"][0]["text"]) for c in chunks if c["choices"])
    assert text == COMPLETION and chunks[-1]["usage"]["total_tokens"] > 0


def test_the_mock_waits_its_delay_before_a_completion_but_not_before_a_probe(mock_engine):
    url = mock_engine[150]
    with httpx.Client() as client:
        client.get(f"{url}/v1/models")
        started = time.perf_counter()
        client.get(f"{url}/v1/models")
        probe = time.perf_counter() - started
        started = time.perf_counter()
        client.post(f"{url}/v1/chat/completions", json={"model": "mock", "messages": []})
        completion = time.perf_counter() - started
    assert completion >= 0.15 and probe < 0.1


def test_histogram_quantiles_interpolate_inside_the_bucket_and_read_nothing_past_the_last():
    from bench.peers import _histogram_quantile

    name = "tucano_gateway_overhead_seconds"
    before = {f"{name}_count": 0, f"{name}_bucket0.0005": 0, f"{name}_bucket0.001": 0, f"{name}_bucket0.002": 0, f"{name}_bucket+Inf": 0}
    # 100 requests: 40 within 0.5 ms, 50 more within 1 ms, 9 within 2 ms, 1 beyond
    after = {f"{name}_count": 100, f"{name}_bucket0.0005": 40, f"{name}_bucket0.001": 90, f"{name}_bucket0.002": 99, f"{name}_bucket+Inf": 100}
    assert _histogram_quantile(before, after, 0.5) == 0.6  # the 50th: 10 of the 50 between 0.5 and 1 ms
    assert _histogram_quantile(before, after, 0.99) == 2.0
    assert _histogram_quantile(before, after, 0.999) is None  # past 2 ms: unknown, not guessed
    assert _histogram_quantile(after, after, 0.5) is None


def test_added_latency_intervals_hold_a_constant_shift():
    import random

    from bench.peers import _added_intervals

    rng = random.Random(5)
    direct = [[1.0 + rng.random() for _ in range(64)] for _ in range(8)]
    side = [[ms + 3.0 for ms in block] for block in direct]
    read = _added_intervals(direct, side)
    for key in ("added_p50_ci95_ms", "added_p99_ci95_ms", "added_p999_ci95_ms"):
        assert read[key] == [3.0, 3.0], (key, read[key])


def test_the_profile_summary_counts_each_frame_once_per_stack_and_self_time_by_package():
    from bench.peers import by_package, hottest_frames

    collapsed = "\n".join(["main (a.py:1);handle (server/b.py:2);score (rewards/c.py:3) 6", "main (a.py:1);handle (server/b.py:2) 2",
                           "main (a.py:1);write (redis/d.py:4);write (redis/d.py:4) 2", "garbage line"])
    frames = hottest_frames(collapsed)
    assert [f["frame"] for f in frames] == ["score (rewards/c.py:3)", "handle (server/b.py:2)", "write (redis/d.py:4)"]
    assert frames[1] == {"frame": "handle (server/b.py:2)", "self": 0.2, "inclusive": 0.8}
    assert frames[2]["inclusive"] == 0.2  # recursion counts once
    assert by_package(collapsed) == {"rewards": 0.6, "server": 0.2, "redis": 0.2}
    assert hottest_frames("") == [] and by_package("") == {}


def test_every_side_gets_the_same_review_and_ours_does_the_task():
    from bench.peers import SIDES, Requests

    made = Requests(["O produto chegou quebrado.", "Adorei a entrega rápida."])
    for workload in ("extraction", "chat"):
        for side in SIDES:
            bodies = made.bodies[workload, side]
            assert len(bodies) == 2 and all("O produto chegou quebrado." in body.decode() for _, body in bodies[:1])
    path, body = made.bodies["extraction", "tucano"][0]
    assert path == "/v1/tasks/extraction" and json.loads(body) == {"input": {"review": "O produto chegou quebrado."}}
    path, body = made.bodies["extraction", "litellm"][0]
    sent = json.loads(body)
    assert path == "/v1/chat/completions" and sent["response_format"]["json_schema"]["schema"]["type"] == "object"
    assert made.bodies["extraction", "litellm"] == made.bodies["extraction", "vllm-router"] == made.bodies["extraction", "direct"]
    assert made.bodies["chat", "python-hop"] == made.bodies["chat", "direct"]


def test_verdicts_compare_with_litellm_at_every_level_and_read_our_own_time_at_the_target_rate():
    from bench.peers import verdicts

    def side(added: float) -> dict:
        return {"added_p50": added}
    results = {"delays": [{"closed": [{"workload": "extraction", "concurrency": 1, "sides": {"tucano": side(1.0), "litellm": side(10.0)}},
                                      {"workload": "chat", "concurrency": 8, "sides": {"tucano": side(4.0), "litellm": side(6.0)}}],
                           "open": [{"rate": 1000, "sides": {"tucano": {"own_p50_ms": 0.4, "own_p99_ms": 2.5}}}]}]}
    read = {target: verdict for target, _, verdict in verdicts(results)}
    assert list(read.values()) == ["met", "missed", "met", "missed"]
    results["delays"][0]["open"] = [{"rate": 500, "sides": {"tucano": {}}}]  # stopped holding before 1000 req/s
    assert verdicts(results)[0][2] == "missed"
    results["rates"] = [100, 500]  # never asked for 1000 req/s: not a miss
    assert verdicts(results)[0][1:] == ("not measured (--rate did not ask for 1000)", "not measured")
