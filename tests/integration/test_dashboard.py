"""The dashboard in a real browser (Debian's headless Chromium driven by Playwright; nothing is
downloaded) over the real stack: traffic, feedback and a round through the session's gateway,
then the page's charts are read back and held against what the API returns; admin buttons are
refused without the admin key; the page stays readable with no rounds, a task with no traffic,
and Redis down. Screenshots at desktop and phone width go to <data dir>/bench/dashboard/."""
from __future__ import annotations

import asyncio
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from common.datasets import load_split
from common.rounds import Outcome
from common.settings import load_settings
from tests.integration.conftest import RunningServer, fleet_for, loop_settings, make_state
from tests.integration.test_learning_loop import _send
from trainer.round import run_round

DESKTOP = {"width": 1366, "height": 768}
PHONE = {"width": 390, "height": 844}


def chromium_path() -> str:
    path = os.environ.get("TUCANO_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("the browser tests need Chromium: `apt-get install chromium` (Debian), or set TUCANO_CHROMIUM to its binary")
    return path


@pytest.fixture(scope="module")
def browser(served):
    """Headless Chromium. Playwright's sync API runs an event loop in this thread while it is open,
    so the traffic and the round (which run their own loops) come first, and the rollback of the
    round-loop fixture after it closes."""
    with chromium() as launched:
        yield launched


@contextmanager
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def open_page(browser, url: str, viewport=DESKTOP):
    """The dashboard loaded (its first fetches settled); uncaught script errors are collected."""
    page = browser.new_page(viewport=viewport)
    page.script_errors = []
    page.on("pageerror", lambda error: page.script_errors.append(str(error)))
    page.goto(f"{url}/dashboard")
    page.evaluate("() => window.tucano.ready")
    return page


def use_key(page, key: str) -> None:
    """Type a key into the page and wait until its figures were read again with it."""
    page.fill("#api-key", key)
    page.click("#key-form button")
    page.wait_for_function("() => document.getElementById('status').textContent.startsWith('Updated')")


def click_confirming(page, selector: str, accept: bool = True) -> None:
    page.once("dialog", lambda dialog: dialog.accept() if accept else dialog.dismiss())
    page.click(selector)


def show_task(page, task: str) -> None:
    page.click(f"#tasks button:text-is('{task}')")
    page.wait_for_selector(f"#tasks button[aria-pressed='true']:text-is('{task}')")


@pytest.fixture(scope="module")
def served(built, redis_url, gateway, loop):
    """Push and SQL traffic with ratings through the gateway, then a round over push whose gate
    cannot promote (its candidate stays in the lineage with a Promote button for the admin test)."""
    settings, store = loop
    # rows no other module sends (the session's Redis is shared: the same inputs rated both ways
    # would give test_learning_loop's ratings-only round DPO pairs instead of KTO examples)
    for task, count in (("push", 32), ("sql", 12)):
        rows = load_split(settings.datasets_dir, task, "train")[100:100 + count]
        answers = asyncio.run(_send(gateway.url, store, task, [{"input": row["input"]} for row in rows]))
        for i, answer in enumerate(answers):
            response = httpx.post(f"{gateway.url}/v1/feedback", json={"id": answer["id"], "rating": 1 if i % 3 else -1})
            assert response.status_code == 200, response.text
    quick = loop_settings(built, redis_url, train_time_budget_s=10, promote_margin=0.99)
    summary = run_round(quick, store, fleet_for(quick, store, gateway), ("push",), say=print)
    assert summary.tasks["push"].gate and summary.tasks["push"].outcome == Outcome.REJECTED, summary.tasks["push"]
    return summary


def test_the_charts_hold_what_the_api_returns(browser, gateway, served, built):
    page = open_page(browser, gateway.url)
    show_task(page, "push")
    stats = httpx.get(f"{gateway.url}/v1/stats?window_s=86400").json()["tasks"]["push"]
    drawn = page.evaluate("""() => Object.fromEntries(window.tucano.charts['traffic-chart'].data.datasets.map(d =>
        [d.version, d.data.reduce((sum, point) => sum + point.y, 0)]))""")
    assert drawn == {v["version"]: v["requests"] for v in stats["versions"]} and sum(drawn.values()) >= 32
    rewards = page.evaluate("""() => Object.fromEntries(window.tucano.charts['reward-chart'].data.datasets.map(d =>
        [d.version, d.data.map(point => point.y)]))""")
    assert rewards == {v["version"]: [p["mean_reward"] for p in v["points"]] for v in stats["versions"]}
    rounds = httpx.get(f"{gateway.url}/v1/rounds?limit=100").json()["rounds"]
    judged = [r["tasks"]["push"]["gate"]["decision"]["candidate_mean"] for r in reversed(rounds)
              if ((r.get("tasks", {}).get("push", {}).get("gate") or {}).get("decision") or {}).get("n")]
    candidate = page.evaluate("""() => window.tucano.charts['learning-chart'].data.datasets
        .find(d => d.label === 'candidate').data.map(point => point.y)""")
    assert candidate == judged and served.tasks["push"].gate.decision.candidate_mean in candidate
    calibration = stats["calibration"]  # beside the served-reward curve, saying whether to trust it
    said = page.inner_text("#calibration")
    verdict = "too few labels" if calibration["weak"] is None else ("Weak calibration" if calibration["weak"] else "Calibrated")
    assert verdict in said and f"({calibration['n']} answers)" in said
    feedback = stats["feedback"]
    text = page.inner_text("#feedback")
    assert f"{feedback['ratings']} ({feedback['positive']} up, {feedback['negative']} down)" in text
    versions = {m["version"] for m in httpx.get(f"{gateway.url}/v1/adapters").json()["adapters"] if m["task"] == "push"}
    assert {row.split("\t")[0] for row in page.locator("#lineage tbody tr").all_inner_texts()} == versions
    assert served.tasks["push"].version in versions
    shots = built.data_dir / "bench" / "dashboard"
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=shots / "desktop-1366x768.png", full_page=True)
    phone = open_page(browser, gateway.url, PHONE)
    show_task(phone, "push")
    # readable at phone width: nothing wider than the screen but the lineage table's own scroller
    assert phone.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    phone.screenshot(path=shots / "phone-390x844.png", full_page=True)
    assert not page.script_errors and not phone.script_errors
    print(f"screenshots: {shots}")


def test_a_running_round_is_shown_above_the_figures(browser, gateway, loop):
    """What a round's trainer writes as it goes (`Store.set_progress`) is on the page at the next
    load, and gone once the round has ended."""
    from common.records import JobProgress

    _, store = loop
    assert httpx.get(f"{gateway.url}/readyz").json()["jobs"] == []
    store.set_progress(JobProgress(job="round", stage="sql training", share=0.4, of_whole=True, seconds_spent=240.0,
                                   seconds_left=360.0, text="round: sql training 40%"))
    try:
        page = open_page(browser, gateway.url)
        assert page.inner_text("#jobs") == "Training round: sql training, 40%, about 6 min left"
        assert httpx.get(f"{gateway.url}/readyz").json()["jobs"][0]["stage"] == "sql training"
    finally:
        store.end_progress("round")
    page.click("#refresh")
    page.wait_for_function("() => document.getElementById('jobs').hidden")
    assert not page.script_errors


def test_admin_buttons_are_refused_without_the_admin_key(browser, built, redis_url, engines, served, gateway):
    settings = load_settings(data_dir=built.data_dir, redis_url=redis_url, user_api_key=SecretStr("dash-user"),
                             admin_api_key=SecretStr("dash-admin"), rate_limit_per_minute=0)
    with RunningServer(create_app_with_keys(settings, redis_url, engines)) as keyed:
        routes_before = gateway.state.store.routes()[1]
        page = open_page(browser, keyed.url)
        assert "needs an API key" in page.inner_text("#status")
        use_key(page, "dash-user")
        show_task(page, "push")
        click_confirming(page, "[data-action='rollback']")
        page.wait_for_function("() => document.getElementById('status').textContent.includes('refused')")
        assert "needs the admin key" in page.inner_text("#status")
        click_confirming(page, "#lineage button.admin >> nth=0")
        page.wait_for_function("() => document.getElementById('status').textContent.startsWith('promote refused')")
        assert "needs the admin key" in page.inner_text("#status")
        assert gateway.state.store.routes()[1] == routes_before
        # the admin key gets through to the action, which refuses what cannot be done (no canary): 409
        use_key(page, "dash-admin")
        click_confirming(page, "[data-action='canary/abort']")
        page.wait_for_function("() => document.getElementById('status').textContent.startsWith('canary/abort refused')")
        assert "conflict" in page.inner_text("#status")
        # a dismissed confirmation sends nothing, even with the admin key
        before = page.inner_text("#status")
        click_confirming(page, "#lineage button.admin >> nth=0", accept=False)
        page.wait_for_timeout(500)
        assert page.inner_text("#status") == before
        assert not page.script_errors and gateway.state.store.routes()[1] == routes_before


def create_app_with_keys(settings, redis_url, engines):
    from server.app import create_app

    return create_app(make_state(settings, redis_url, [engines["base"].url], engines["think"].url))


def test_no_rounds_and_no_traffic_read_as_such(browser, built, engines, tmp_path):
    from deploy.embedded_redis import EmbeddedRedis
    from server.app import create_app

    with EmbeddedRedis(tmp_path / "redis") as fresh_url:
        settings = load_settings(data_dir=built.data_dir, redis_url=fresh_url)
        with RunningServer(create_app(make_state(settings, fresh_url, [engines["base"].url], engines["think"].url))) as fresh:
            page = open_page(browser, fresh.url)
            show_task(page, "insights")
            assert "No insights traffic in this window." in page.inner_text("#traffic-empty")
            assert "too few labels to say (rank correlation with the labels - (0 answers)" in page.inner_text("#calibration")
            assert "No round has judged" in page.inner_text("#learning-empty")
            assert "No insights adapter yet" in page.inner_text("#lineage")
            assert "base model" in page.inner_text("#route")
            assert page.locator("#status").get_attribute("class") != "error" and not page.script_errors


def test_redis_down_reads_as_such(browser, built, engines):
    from server.app import create_app

    settings = load_settings(data_dir=built.data_dir, redis_url="redis://127.0.0.1:9/0")
    with RunningServer(create_app(make_state(settings, settings.redis_url, [engines["base"].url], engines["think"].url))) as down:
        page = open_page(browser, down.url, PHONE)
        status = page.inner_text("#status")
        assert "cannot read its store (Redis)" in status and "store_unavailable" in status
        assert page.locator("#status").get_attribute("class") == "error"
        assert page.inner_text("#route") and page.inner_text("#last-round") and not page.script_errors
        page.screenshot(path=Path(built.data_dir) / "bench" / "dashboard" / "phone-redis-down.png", full_page=True)


def test_the_grafana_board_queries_series_a_live_gateway_exposes(gateway, served):
    from prometheus_client.parser import text_string_to_metric_families

    from tests.unit.test_grafana import missing_series

    text = httpx.get(f"{gateway.url}/metrics").text
    assert not missing_series(text)
    samples = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    for name in ("tucano_requests_total", "tucano_request_latency_seconds_bucket", "tucano_reward_sum", "tucano_engine_up",
                 "tucano_store_up", "tucano_round_decisions_total", "tucano_round_last_duration_seconds"):
        assert name in samples, name
    decisions = {(sample.labels["task"], sample.labels["outcome"]): sample.value for family in text_string_to_metric_families(text)
                 for sample in family.samples if sample.name == "tucano_round_decisions_total"}
    assert decisions[("push", "rejected")] >= 1  # the round `served` ran, counted as it was saved
