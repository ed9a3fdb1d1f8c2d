"""Corrections that act at once (router/examples.py): what becomes an example, what is retrieved
for a request, an exact repeat of a corrected input, and the prompt that shows the examples."""
from __future__ import annotations

import json

from common.datasets import input_hash, load_split
from common.records import Label, RewardContext
from common.tasks import ExtractionInput, SqlInput
from router import examples as examples_module
from router.examples import ExampleBook, Examples
from router.prompts import build_messages


def label(i: int, review: str, answer=None, source=None, rating=None, split="train", retired_by=None, at=None) -> Label:
    task_input = {"review": review}
    return Label(id=f"r{i}", task="extraction", input=task_input, input_hash=input_hash("extraction", task_input), split=split,
                 served='{"sentiment": "neutral"}', served_version="base", time=float(at or i), answer=answer,
                 answer_source=source, rating=rating, updated=float(at or i), retired_by=retired_by)


FIXED = {"sentiment": "negative", "complaint_category": "product_defect"}
LABELS = [
    label(1, "O fone chegou quebrado e não liga.", FIXED, "correction"),
    label(2, "A entrega atrasou duas semanas.", {"sentiment": "negative", "complaint_category": "delivery_delay"}, "reference"),
    label(3, "Amei a cadeira, super confortável.", rating=1),
    label(4, "O relógio veio com defeito na pulseira.", FIXED, "correction", split="eval"),
    label(5, "A mochila rasgou no primeiro dia.", FIXED, "correction", retired_by="extraction-v2"),
    label(6, "Produto razoável, nada de especial.", rating=-1),
]


def test_similar_inputs_retrieve_the_teams_answers_but_never_eval_or_retired_ones():
    book = ExampleBook("extraction", LABELS)
    assert {e.id for e in book.examples} == {"r1", "r2", "r3"}  # r4 is eval, r5 retired, r6 disliked
    similar = book.similar(ExtractionInput(review="Meu fone de ouvido chegou quebrado."), k=2)
    assert similar[0].id == "r1" and similar[0].answer == json.dumps(FIXED, ensure_ascii=False)
    liked = book.similar(ExtractionInput(review="Amei a cadeira nova."), k=1)
    assert liked[0].id == "r3" and liked[0].source == "liked" and liked[0].answer == '{"sentiment": "neutral"}'
    assert book.similar(ExtractionInput(review="xyz"), k=3) == []  # nothing in common: nothing shown
    assert all(e.id != "r1" for e in book.similar(ExtractionInput(review="O fone chegou quebrado e não liga."), k=3))  # never itself


def test_inputs_without_a_word_to_match_are_never_retrieved_and_break_nothing():
    """A corrected input of only stop words or punctuation has no word to index; a task whose every
    example is such an input once made bm25s fail on an empty vocabulary, and every request a 500."""
    wordless = [label(8, "e o a", FIXED, "correction"), label(9, "?!...", FIXED, "correction")]
    book = ExampleBook("extraction", wordless)
    assert book.examples == [] and book.similar(ExtractionInput(review="O fone chegou quebrado."), k=2) == []
    assert book.correction_for(ExtractionInput(review="e o a")).id == "r8"  # its exact repeat still gets the correction
    mixed = ExampleBook("extraction", LABELS + wordless)
    assert {e.id for e in mixed.examples} == {"r1", "r2", "r3"}
    assert mixed.similar(ExtractionInput(review="Meu fone de ouvido chegou quebrado."), k=1)[0].id == "r1"


def test_an_exact_repeat_of_a_corrected_input_is_answered_by_its_newest_correction():
    newer = label(7, "O fone chegou quebrado e não liga.", {"sentiment": "negative", "complaint_category": "wrong_item"},
                  "correction", at=10)
    book = ExampleBook("extraction", LABELS + [newer])
    repeat = book.correction_for(ExtractionInput(review="O fone chegou quebrado e não liga."))
    assert repeat.id == "r7" and "wrong_item" in repeat.answer
    assert book.correction_for(ExtractionInput(review="O relógio veio com defeito na pulseira.")).id == "r4"  # eval: still answered
    assert book.correction_for(ExtractionInput(review="A entrega atrasou duas semanas.")) is None  # a reference, not a correction


class CountingStore:
    def __init__(self, labels, pretrained=False):
        self.labels_list, self.version, self.reads, self.pretrained = labels, 1, 0, pretrained

    def examples_state(self, task):
        return self.version, self.pretrained

    def labels(self, task):
        self.reads += 1
        return self.labels_list


def test_the_index_is_rebuilt_only_when_the_labels_change():
    store = CountingStore(LABELS)
    examples = Examples(store, ["extraction"], k=2, exact_repeats=True, poll_s=0.0)
    repeat, shown = examples.for_request("extraction", ExtractionInput(review="O fone chegou quebrado e não liga."))
    assert repeat.id == "r1" and shown == []
    repeat, shown = examples.for_request("extraction", ExtractionInput(review="Meu fone veio quebrado."))
    assert repeat is None and shown[0].id == "r1" and store.reads == 1
    store.version = 2
    store.labels_list = LABELS + [label(8, "Meu fone veio quebrado.", FIXED, "correction")]
    assert examples.for_request("extraction", ExtractionInput(review="Meu fone veio quebrado."))[0].id == "r8" and store.reads == 2
    off = Examples(store, [], k=2, exact_repeats=True, poll_s=0.0)  # retrieval off: repeats still answered
    assert off.for_request("extraction", ExtractionInput(review="Meu fone de ouvido veio quebrado.")) == (None, [])


def test_the_pretrained_weights_are_shown_the_bootstrap_rows_until_the_fine_tuned_model_serves(tmp_path, monkeypatch):
    """While the first serve's engines hold the pretrained weights, a prompt shows the most similar
    rows of the bootstrap split (their targets); the team's own example wins for an input both have;
    once the fine-tuned model serves, the rows are shown no more."""
    (tmp_path / "extraction").mkdir()
    rows = [{"id": "extraction-bootstrap-00000", "task": "extraction", "input": {"review": "A cadeira quebrou na primeira semana."},
             "reference": FIXED, "target": '{"sentiment": "negative"}'},
            {"id": "extraction-bootstrap-00001", "task": "extraction", "input": LABELS[0].input, "reference": FIXED,
             "target": '{"sentiment": "positive"}'}]
    (tmp_path / "extraction" / "bootstrap.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    store = CountingStore(LABELS, pretrained=True)
    split_reads = []
    monkeypatch.setattr(examples_module, "load_split", lambda *args: split_reads.append(args) or load_split(*args))
    examples = Examples(store, ["extraction"], k=3, exact_repeats=True, poll_s=0.0, datasets_dir=tmp_path)
    _, shown = examples.for_request("extraction", ExtractionInput(review="Minha cadeira quebrou."))
    assert shown[0].id == "extraction-bootstrap-00000" and shown[0].source == "bootstrap"
    assert shown[0].answer == '{"sentiment": "negative"}'  # the row's target, as the fine-tuning teaches it
    _, shown = examples.for_request("extraction", ExtractionInput(review="O fone chegou quebrado, não liga mais."))
    assert [e.id for e in shown if e.input == ExtractionInput(**LABELS[0].input)] == ["r1"]  # the team's answer, not the row's
    store.version += 1  # a new label: the book is rebuilt, the split is not read again
    assert examples.for_request("extraction", ExtractionInput(review="Minha cadeira quebrou."))[1][0].id == "extraction-bootstrap-00000"
    assert len(split_reads) == 1 and store.reads == 2
    store.pretrained = False  # the fine-tuned weights serve now
    _, shown = examples.for_request("extraction", ExtractionInput(review="Minha cadeira quebrou."))
    assert all(e.source != "bootstrap" for e in shown) and store.reads == 3
    store.pretrained = True
    assert Examples(store, [], k=3, exact_repeats=True, poll_s=0.0, datasets_dir=tmp_path).for_request(
        "extraction", ExtractionInput(review="Minha cadeira quebrou.")) == (None, [])  # retrieval off for the task: no rows either
    no_split = Examples(store, ["extraction"], k=3, exact_repeats=True, poll_s=0.0, datasets_dir=tmp_path / "elsewhere")
    assert all(e.source != "bootstrap" for e in no_split.for_request("extraction", ExtractionInput(review="Minha cadeira quebrou."))[1])


def test_demonstrations_come_before_the_request_as_earlier_turns():
    messages = build_messages("sql", SqlInput(question="Quantos pedidos em SP?"), ((SqlInput(question="Quantos pedidos em RJ?"),
                                                                               "SELECT COUNT(*) FROM orders_enriched WHERE customer_state = 'RJ'"),))
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"] == "Pergunta: Quantos pedidos em RJ?" and messages[-1]["content"] == "Pergunta: Quantos pedidos em SP?"
    assert build_messages("sql", SqlInput(question="x")) == [messages[0], {"role": "user", "content": "Pergunta: x"}]


def test_a_promoted_version_retires_the_examples_it_answers_right_on_its_own():
    import asyncio

    from router.engine_client import Completion
    from trainer import retire

    class Template:
        def render(self, messages):
            return messages[-1]["content"]

    from tests.unit.test_reference_free_claims import HONEST_EXTRACTION

    whole = [label(1, "O fone chegou quebrado e não liga.", HONEST_EXTRACTION, "correction"),
             label(2, "A entrega atrasou duas semanas.", HONEST_EXTRACTION, "reference")]

    class Pool:
        template = Template()

        async def complete(self, prompt, version, sampling, schema):
            right = "quebrado" in prompt  # the version learned the first, not the second
            answer = HONEST_EXTRACTION if right else {**HONEST_EXTRACTION, "sentiment": "positive", "complaint_category": "none"}
            return Completion(json.dumps(answer), 1, 1, "stop", "e", "m")

    class Store:
        def __init__(self):
            self.retired = None

        def labels(self, task):
            return whole

        def retire_labels(self, task, ids, version):
            self.retired = (ids, version)
            return len(ids)

    assert [label.id for label in retire.candidates(LABELS, {"r1", "r2", "r3", "r5"})] == ["r2", "r1"]  # r3 liked, r5 retired
    store = Store()
    settings = type("S", (), {"reward_context": staticmethod(RewardContext)})()
    outcome = asyncio.run(retire.retire_absorbed(Pool(), settings, store, "extraction", "extraction-v3", {"r1", "r2"}, seed=1))
    assert store.retired == (["r1"], "extraction-v3") and outcome.checked == 2 and outcome.retired == 1


def test_a_promotion_checks_the_labels_its_version_trained_on_by_either_path():
    import asyncio

    from common.records import AdapterMeta
    from common.rounds import DataSources, Retirement, TrainingData
    from trainer import retire

    sources = DataSources(sft=["a", "b"], pairs=["b", "c"], kto=["d"], prompts=["e"])
    meta = AdapterMeta(version="sql-v2", task="sql", path="/x", data=TrainingData(sources=sources))
    assert retire.trained_labels(meta) == {"a", "b", "c", "d"}  # a GRPO prompt is no example it was shown the answer of
    untrained = AdapterMeta(version="sql-v3", task="sql", path="/x")
    outcome = asyncio.run(retire.retire_after_promotion(None, None, [], untrained, seed=0))
    assert outcome == Retirement(checked=0, retired=0, reason="it trained on no labelled example")


def test_a_version_served_with_the_examples_its_gate_judged_it_with_retires_none(monkeypatch):
    import asyncio

    from common.records import AdapterMeta
    from common.rounds import DataSources, GateDecision, GateRecord, Retirement, TrainingData
    from trainer import retire

    def gated(served_alone: bool, both_ways: bool = True) -> AdapterMeta:
        alone = GateDecision(promote=served_alone, reason="", n=64, rows={}, candidate_mean=0.6, incumbent_mean=0.4, difference=0.2,
                             interval=(0.1, 0.3))
        decision = GateDecision(promote=True, reason="", n=64, rows={}, candidate_mean=0.6, incumbent_mean=0.4, difference=0.2,
                                interval=(0.1, 0.3), served_alone=served_alone, alone=alone if both_ways else None)
        return AdapterMeta(version="sql-v2", task="sql", path="/x", data=TrainingData(sources=DataSources(sft=["a"])),
                           gate=GateRecord(decision=decision, incumbent="base"))

    class Pool:
        async def check(self):
            return True

        async def close(self):
            pass

    checked = []

    async def retire_absorbed(pool, settings, store, task, version, trained, seed):
        checked.append((version, trained))
        return Retirement(checked=len(trained), retired=0, reason="checked")

    monkeypatch.setattr(retire.EnginePool, "for_task", lambda *args: Pool())
    monkeypatch.setattr(retire, "retire_absorbed", retire_absorbed)
    kept = asyncio.run(retire.retire_after_promotion(None, None, [], gated(False), seed=0))
    assert kept.checked == kept.retired == 0 and kept.reason.startswith("its gate judged it with the examples") and checked == []
    alone = asyncio.run(retire.retire_after_promotion(None, None, [], gated(True), seed=0))  # served alone: it checks what it absorbed
    assert alone.checked == 1 and checked == [("sql-v2", {"a"})]
    one_way = asyncio.run(retire.retire_after_promotion(None, None, [], gated(False, both_ways=False), seed=0))
    assert one_way.checked == 1 and len(checked) == 2  # judged only with its prompts as they were: retires as before


def test_the_gate_shows_each_row_the_examples_serving_would_show():
    from common.settings import load_settings
    from trainer.gate import EvalRow, demonstrations

    class Store:
        def labels(self, task):
            return LABELS

    rows = [EvalRow("e1", "team", ExtractionInput(review="Meu fone veio quebrado."), None),
            EvalRow("e2", "bootstrap", ExtractionInput(review="xyz"), None)]
    shown = demonstrations(load_settings(examples_k=1), Store(), "extraction", {row.id: row.input for row in rows})
    assert [inp for inp, _ in shown["e1"]] == [ExtractionInput(**LABELS[0].input)] and shown["e2"] == ()
    assert demonstrations(load_settings(examples_tasks=[]), Store(), "extraction", {row.id: row.input for row in rows}) == {}
