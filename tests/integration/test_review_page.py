"""The review page in a real browser (Debian's headless Chromium driven by Playwright) over the
session's gateway: recent answers listed, the most useful label first; an unsafe SQL correction
refused at its field; a correction saved with the keyboard and stored as the record's label; a
like by keyboard; readable at desktop and phone width. Screenshots go to <data dir>/bench/review/."""
from __future__ import annotations

import asyncio
import time

import pytest

from tests.integration.test_dashboard import DESKTOP, PHONE, chromium
from tests.integration.test_learning_loop import _send


@pytest.fixture(scope="module")
def browser(gateway):
    # traffic first: Playwright's sync API holds an event loop in this thread while it is open
    questions = [{"input": {"question": f"Quantos pedidos do estado de SP foram feitos em 2017? (revisão {time.time_ns()}-{i})"}}
                 for i in range(4)]
    asyncio.run(_send(gateway.url, gateway.state.store, "sql", questions))
    with chromium() as launched:
        yield launched


def open_review(browser, url: str, viewport=DESKTOP):
    page = browser.new_page(viewport=viewport)
    page.script_errors = []
    page.on("pageerror", lambda error: page.script_errors.append(str(error)))
    page.goto(f"{url}/review")
    page.evaluate("() => window.tucano.ready")
    page.click("#tasks button:text-is('sql')")
    # the first tab's queue may already be on the page: wait for the sql queue itself
    page.wait_for_function("() => window.tucano.state.loaded === 'sql' && window.tucano.state.items.length > 0")
    return page


def test_a_reviewer_corrects_and_likes_answers_with_the_keyboard(browser, gateway, built):
    page = open_review(browser, gateway.url)
    items = page.evaluate("() => window.tucano.state.items")
    assert [i["priority"] for i in items] == sorted((i["priority"] for i in items), reverse=True)
    first = items[0]["id"]
    assert page.locator("#queue li").count() == len(items) and page.inner_text("#item-input")

    page.fill("#editor textarea[name=sql]", "DELETE FROM olist_orders_dataset")
    page.click("#save")
    page.wait_for_function("() => document.getElementById('item-result').textContent.startsWith('Refused')")
    assert page.inner_text("[data-error-of=sql]").startswith("Refused") and "SELECT" in page.inner_text("[data-error-of=sql]")
    assert gateway.state.store.get_record(first).record.feedback is None  # nothing stored

    fixed = "SELECT COUNT(*) FROM orders_enriched WHERE customer_state = 'SP'"
    page.fill("#editor textarea[name=sql]", fixed)
    page.keyboard.press("Escape")  # leave the field: the keys act on the page
    page.keyboard.press("s")
    page.wait_for_function("() => document.getElementById('item-result').textContent.startsWith('Saved')")
    stored = gateway.state.store.get_record(first).record
    assert stored.reference == {"sql": fixed} and stored.feedback.rating == -1

    page.keyboard.press("j")
    second = page.evaluate("() => window.tucano.state.items[window.tucano.state.index].id")
    assert second != first
    page.keyboard.press("l")
    page.wait_for_function("() => document.getElementById('item-result').textContent === 'Saved: liked.'")
    assert gateway.state.store.get_record(second).record.feedback.rating == 1
    shots = built.data_dir / "bench" / "review"
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=shots / "desktop-1366x768.png", full_page=True)
    assert not page.script_errors


def test_the_review_page_is_readable_at_phone_width(browser, gateway, built):
    page = open_review(browser, gateway.url, PHONE)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    assert page.locator("#editor textarea[name=sql]").is_visible() and page.locator("#save").is_visible()
    page.screenshot(path=built.data_dir / "bench" / "review" / "phone-390x844.png", full_page=True)
    assert not page.script_errors
