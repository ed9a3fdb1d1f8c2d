"""The dashboard's data path without servers: the time series /v1/stats computes from records
and labels, what a record decodes to as a point, and the page, its assets and /metrics on a
gateway whose Redis and engines do not answer (a readable refusal, never a stack trace)."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from common.records import POINT_DECODER, Label, Reward, encode
from server.stats import feedback_counts, series
from tests.unit.test_access import app_for
from tests.unit.test_shapes_and_routing import make_record


def point(time: float, task: str = "sql", adapter: str | None = None, total: float = 0.5, valid: bool = True):
    return POINT_DECODER.decode(encode(make_record(time=time, task=task, adapter=adapter, valid=valid,
                                                   reward=Reward(total, {}, False))))


def label(rating=None, source=None, task="sql") -> Label:
    return Label(id="r", task=task, input={}, input_hash="h", split="train", served="", served_version="base", time=0.0,
                 answer={"sql": "SELECT 1"} if source else None, answer_source=source, rating=rating)


def test_a_stored_record_decodes_to_the_point_the_charts_need():
    record = make_record(time=12.5, adapter="sql-v2", valid=False, reward=Reward(0.25, {"parse": 0.0}, True))
    decoded = POINT_DECODER.decode(encode(record))
    assert (decoded.time, decoded.task, decoded.version, decoded.valid, decoded.reward.total) == (12.5, "sql", "sql-v2", False, 0.25)
    assert POINT_DECODER.decode(encode(make_record())).version == "base"


def test_series_splits_requests_and_reward_by_version_and_bucket():
    points = [point(1, total=0.2), point(2, total=0.4, valid=False), point(7, adapter="sql-v1", total=0.9),
              point(9.9, adapter="sql-v1", total=0.7), point(5, task="push", total=1.0),
              point(20, total=0.0)]  # after the window: left out
    stats = series(points, {"sql": [label(rating=1), label(source="correction", rating=-1), label(source="reference")]},
                   start=0, end=10, buckets=2, truncated=False)
    sql = stats.tasks["sql"]
    assert sql.requests == 4 and sql.mean_reward == pytest.approx(0.55)
    base, v1 = sorted(sql.versions, key=lambda v: v.version)
    assert [(p.start, p.requests, p.mean_reward, p.invalid) for p in base.points] == [(0, 2, 0.3, 1), (5, 0, None, 0)]
    assert [(p.requests, p.mean_reward) for p in v1.points] == [(0, None), (2, 0.8)]
    assert stats.tasks["push"].requests == 1 and stats.tasks["insights"].requests == 0 and stats.tasks["insights"].versions == []
    assert stats.records == 5 and stats.bucket_s == 5
    assert sql.feedback.model_dump() == {"labels": 3, "references": 1, "corrections": 1, "ratings": 2, "positive": 1, "negative": 1}


def test_feedback_counts_of_a_task_with_no_labels_are_zero():
    assert set(feedback_counts([]).model_dump().values()) == {0}


@pytest.fixture(scope="module")
def down():
    """A gateway whose Redis and engines do not answer."""
    with TestClient(app_for(None, None)) as client:
        yield client


def test_the_page_and_its_chart_library_are_served_from_the_package(down):
    page = down.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for asset in ("/dashboard/assets/dashboard.js", "/dashboard/assets/dashboard.css", "/dashboard/assets/vendor/chart-4.6.1.umd.min.js"):
        assert asset in page.text
        assert down.get(asset).status_code == 200, asset
    assert "Chart.js v4.6.1" in down.get("/dashboard/assets/vendor/chart-4.6.1.umd.min.js").text
    assert down.get("/dashboard/assets/../app.py").status_code == 404
    assert down.get("/dashboard/assets/nothing.js").status_code == 404


def test_with_redis_down_the_stats_are_a_readable_503_and_metrics_say_so(down):
    response = down.get("/v1/stats")
    assert response.status_code == 503 and response.json()["error"]["type"] == "store_unavailable"
    metrics = down.get("/metrics").text
    assert "tucano_store_up 0.0" in metrics
    assert 'tucano_engine_up{kind="base",url="http://127.0.0.1:9"} 0.0' in metrics
    assert "# TYPE tucano_requests_total counter" in metrics and "# TYPE tucano_round_decisions_total counter" in metrics


@pytest.mark.parametrize("query", ["window_s=10", "window_s=abc", "buckets=0", "buckets=501", "window_s=99999999"])
def test_bad_stats_queries_are_422(down, query):
    response = down.get(f"/v1/stats?{query}")
    assert response.status_code == 422 and response.json()["error"]["type"] == "invalid_request"


def test_a_running_round_is_shown_where_people_look(down, monkeypatch):
    """/readyz (ready or not: here the engines are down) and /v1/stats name where a training round
    stands, as the trainer wrote it; the dashboard reads it from /v1/stats."""
    from common.records import JobProgress

    job = JobProgress(job="round", stage="sql training", share=0.4, of_whole=True, seconds_spent=240.0, seconds_left=360.0,
                      text="round: sql training 40%, 4 min 00 s spent, 40% of the whole, about 6 min 00 s left")
    store = down.app.state.gateway.store
    monkeypatch.setattr(store, "ping", lambda: True)
    monkeypatch.setattr(store, "jobs", lambda: [job])
    ready = down.get("/readyz")
    assert ready.status_code == 503 and ready.headers["Retry-After"]  # no engine answers
    assert ready.json()["jobs"][0]["text"].endswith("about 6 min 00 s left") and ready.json()["jobs"][0]["share"] == 0.4
    monkeypatch.setattr(store, "record_points", lambda start, limit: ([], False))
    monkeypatch.setattr(store, "labels", lambda task: [])
    stats = down.get("/v1/stats")
    assert stats.status_code == 200 and stats.json()["jobs"] == [ready.json()["jobs"][0]]
    script = down.get("/dashboard/assets/dashboard.js").text
    assert "function renderJobs()" in script and 'id="jobs"' in down.get("/dashboard").text
