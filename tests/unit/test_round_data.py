"""What a round trains on, followed through `trainer.data`: an input of the eval split never
reaches a training prompt or pair, whether it came as plain traffic or with a correction."""
from __future__ import annotations

import json

from common.datasets import input_key
from common.records import Feedback
from common.store import StoredRecord
from tests.unit.conftest import ctx
from tests.unit.test_shapes_and_routing import make_record
from trainer.data import collect

EVAL_INPUTS = [{"question": f"Quantos pedidos em {year}?"} for year in (2016, 2017)]
TRAIN_INPUTS = [{"question": f"Quantos clientes em {uf}?"} for uf in ("SP", "RJ", "MG")]


def _stored(task_input: dict, n: int, corrected: bool) -> StoredRecord:
    record = make_record(id=f"r{n}", input=task_input, raw="SELECT 1")
    if corrected:
        record.feedback = Feedback(-1, 1.0, "SELECT COUNT(*) FROM olist_orders_dataset")
        record.reference = record.feedback.correction
    return StoredRecord(f"{n}-0", record)


def test_the_rows_a_round_trains_on_never_include_eval_inputs():
    stored = [_stored(task_input, n, corrected=n % 2 == 0)
              for n, task_input in enumerate(EVAL_INPUTS * 3 + TRAIN_INPUTS * 3)]
    held_out = frozenset(input_key(i) for i in EVAL_INPUTS)
    data, unusable, _ = collect(stored, lambda messages: json.dumps(messages, ensure_ascii=False),
                                lambda task_input: ctx(**task_input), ("sql",), held_out)
    sql = data["sql"]
    trained_text = json.dumps(sql.prompts + sql.pairs, ensure_ascii=False)
    for task_input in EVAL_INPUTS:
        assert task_input["question"] not in trained_text
    for task_input in TRAIN_INPUTS:
        assert task_input["question"] in trained_text
    assert sql.skipped["held-out eval input"] == 6 and not unusable
    assert sql.records == len(stored)  # every record is accounted for (acknowledged with the round)
