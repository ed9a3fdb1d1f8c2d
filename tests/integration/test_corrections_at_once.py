"""Corrections that act at once, through the real gateway, Redis and vLLM: a corrected input is
answered with its correction from the next request on, a similar input's prompt shows the
correction as a demonstration, and both say so in the response and the record."""
from __future__ import annotations

import time

import httpx

from common.datasets import input_hash, split_of


def ask(gateway, task: str, task_input: dict) -> dict:
    response = httpx.post(f"{gateway.url}/v1/tasks/{task}", json={"input": task_input, "options": {"seed": 3}}, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def train_split_question(gateway) -> dict:
    """A question new to this store whose label lands in the train split (an eval-split label is
    never a demonstration: the gate measures on it)."""
    for n in range(1000):
        question = {"question": f"Quantos pedidos foram entregues no estado de SP em 2017? (lote {time.time_ns()}-{n})"}
        if split_of(input_hash("sql", question), gateway.state.settings.team_eval_share) == "train":
            return question
    raise AssertionError("no train-split question in 1000 tries")


def test_a_correction_answers_its_input_at_once_and_shows_itself_to_similar_ones(gateway):
    question = train_split_question(gateway)
    first = ask(gateway, "sql", question)
    assert first["answered_from"] is None
    fixed = ("SELECT COUNT(*) FROM olist_orders_dataset o JOIN olist_customers_dataset c ON c.customer_id = o.customer_id "
             "WHERE c.customer_state = 'SP' AND o.order_status = 'delivered'")
    feedback = httpx.post(f"{gateway.url}/v1/feedback", json={"id": first["id"], "rating": -1, "correction": fixed})
    assert feedback.status_code == 200, feedback.text
    time.sleep(gateway.state.settings.examples_poll_s + 0.2)  # a gateway sees changed labels within its poll

    again = ask(gateway, "sql", question)
    assert again["answered_from"] == first["id"] and again["output"]["sql"] == fixed and again["raw"] == fixed
    record = gateway.state.store.get_record(again["id"]).record
    assert record.answered_from == first["id"] and record.engine == "correction" and record.usage.completion_tokens == 0

    similar = ask(gateway, "sql", {"question": "Quantos pedidos foram entregues no estado de SP em 2018?"})
    assert first["id"] in similar["examples"], similar
    shown = gateway.state.store.get_record(similar["id"]).record
    assert shown.examples == similar["examples"] and fixed in shown.prompt and shown.answered_from is None
