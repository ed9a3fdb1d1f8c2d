"""The review queue (server/review.py, /v1/review/{task}, /review): which answers a label would
help most, who may see them, and readable refusals of bad queries or a store that is down."""
from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from common.datasets import input_hash
from common.records import Label, Record, Reward
from common.rounds import ComponentDifference, GateDecision, GateRecord, Outcome, RoundSummary, TaskOutcome, decode_round, encode_round
from server.review import COLD_START_LABELS, coverage_gains, doubt_weight, input_features, rank, similarities, weakest_components
from tasks import typed_input
from tests.unit.test_access import app_for
from tests.unit.test_shapes_and_routing import make_record


def served(rid: str, total: float, question: str = "q", raw: str = "SELECT 1", key_id: str | None = "k1", arm: str = "base",
           components: dict | None = None, **changes):
    return make_record(id=rid, input={"question": question}, raw=raw, key_id=key_id, arm=arm,
                       reward=Reward(total, components or {}, False), **changes)


def labelled(rid: str, rating=None, source=None) -> Label:
    return Label(id=rid, task="sql", input={"question": "q"}, input_hash=input_hash("sql", {"question": "q"}), split="train",
                 served="", served_version="base", time=0.0, rating=rating, answer={"sql": "SELECT 2"} if source else None,
                 answer_source=source)


def seasoned(count: int = 900) -> list[Label]:
    """A task's labels from its earlier answers (rated): at 900 a low score carries 0.9 of the weight."""
    return [labelled(f"earlier-{i}", rating=1) for i in range(count)]


def test_low_scores_disagreements_weak_components_and_canaries_come_first():
    records = [
        served("high", 0.95, "a"),
        served("low", 0.30, "b"),
        served("twice-1", 0.9, "c", raw="SELECT 1"), served("twice-2", 0.9, "c", raw="SELECT 2"),
        served("canary", 0.8, "d", arm="canary", adapter="sql-v2"),
        served("weak", 0.85, "e", components={"question_match": 0.2}),
    ]
    decision = GateDecision(promote=False, reason="", n=30, rows={}, candidate_mean=0.5, incumbent_mean=0.5, difference=0.0,
                            interval=(-0.1, 0.1), components={"question_match": ComponentDifference(-0.1, (-0.2, 0.0), False),
                                                              "parse": ComponentDifference(0.2, (0.1, 0.3), False)})
    judged = TaskOutcome(outcome=Outcome.REJECTED, why="new labels", gate=GateRecord(decision=decision, incumbent="base"))
    rounds = [RoundSummary(round="r1", started=1.0, tasks={"sql": judged})]
    ranked = rank("sql", records, seasoned(), rounds, "k1", False, 10)
    order = [record.id for record, _, _ in ranked]
    assert order[0] == "low" and order[-2:] == ["high", "twice-2"]  # the second answer to an input listed already goes last
    assert order.index("twice-1") < order.index("high") and order.index("canary") < order.index("high")
    why = {record.id: reasons for record, _, reasons in ranked}
    assert "the same input was served different answers" in why["twice-1"]
    assert any("question_match" in reason for reason in why["weak"]) and any("canary" in reason for reason in why["canary"])
    assert weakest_components(rounds, "sql") == {"question_match"} and weakest_components([], "sql") == set()


def test_the_queue_spreads_over_the_inputs_instead_of_listing_near_repeats_first():
    """Ten low-scored answers to near-identical questions and three to different ones: the
    different ones are not buried under the repeats, and the priorities still fall down the list."""
    repeats = [served(f"rep-{i}", 0.20, f"quantos pedidos foram entregues em sao paulo no mes {i}") for i in range(10)]
    others = [served("cities", 0.30, "quais cidades de minas gerais compraram mais eletronicos"),
              served("payments", 0.32, "qual o valor medio das parcelas pagas com boleto"),
              served("sellers", 0.35, "liste os vendedores do parana com mais avaliacoes ruins")]
    ranked = rank("sql", repeats + others, seasoned(), [], "k1", False, 13)
    top = [record.id for record, _, _ in ranked[:5]]
    assert {"cities", "payments", "sellers"} <= set(top) and top[0].startswith("rep-")
    priorities = [priority for _, priority, _ in ranked]
    assert priorities == sorted(priorities, reverse=True) and len(ranked) == 13
    assert any("like an input labelled or listed above it" in reason for reason in dict((r.id, why) for r, _, why in ranked)["rep-1"])


def shown(of: frozenset[str], by: frozenset[str]) -> float:
    """The share of `of`'s items that `by` holds too."""
    return len(of & by) / len(of) if of else 0.0


def test_similarities_are_the_share_of_an_input_another_shows_with_identical_inputs_at_one_and_gains_what_a_pick_adds():
    inputs = [{"question": q} for q in ("quantos pedidos foram entregues em sao paulo", "quantos pedidos foram entregues no parana",
                                        "quantos pedidos foram cancelados em sao paulo", "qual vendedor vendeu mais cadeiras gamer",
                                        "?", "!", "pedidos entregues")]  # "?" and "!" have no content words, and are different inputs
    features = [input_features("insights", typed_input("insights", i)) for i in inputs]  # a task whose inputs are their words alone
    words = [only for only, in features]
    hashes = [input_hash("insights", i) for i in inputs]
    similarity = similarities(features, hashes)
    expected = [[1.0 if i == j else shown(b, a) for j, b in enumerate(words)] for i, a in enumerate(words)]
    assert similarity == pytest.approx(np.asarray(expected))
    assert similarity[4, 5] == 0.0 and similarity[0, 3] == 0.0
    assert similarity[0, 6] == 1.0 and similarity[6, 0] == pytest.approx(2 / 5)  # the longer shows all of the shorter, not back
    assert similarities([features[0], features[0]], [hashes[0], hashes[0]]) == pytest.approx(np.ones((2, 2)))
    nothing = np.zeros(len(inputs))
    assert coverage_gains(similarity, nothing) == pytest.approx(similarity.sum(axis=1))
    after_first = np.maximum(nothing, similarity[0])
    assert coverage_gains(similarity, after_first)[0] == 0.0  # a pick adds nothing a second time
    assert coverage_gains(similarity, after_first)[3] == pytest.approx(1.0)  # the odd one adds only itself
    assert coverage_gains(similarity, after_first)[2] < coverage_gains(similarity, nothing)[2]


def test_without_labels_the_queue_labels_a_campaigns_input_with_every_field_before_one_without_the_customers_name():
    """Push traffic in miniature: black_friday inputs with the customer's name, the product and the
    discount, and as many without the name. Names are words no other input shares: by overlap
    (Jaccard), the nameless ones looked most typical and came first, and the campaign's label then
    taught copy with no name although most inputs carry one; a named input shows all of a nameless
    one of its product, so it leads."""
    def push(rid: str, **fields):
        return make_record(id=rid, task="push", input={"campaign": "black_friday", **fields}, raw="{}", key_id="k1",
                           reward=Reward(0.5, {}, False))
    products = ["mouse sem fio", "garrafa termica", "mouse sem fio"]
    named = [push(f"named-{i}", customer_name=name, product=product, discount_pct=20)
             for i, (name, product) in enumerate(zip(["Ana", "Bruno", "Carla"], products))]
    nameless = [push(f"nameless-{i}", product=product, discount_pct=20) for i, product in enumerate(products)]
    ranked = rank("push", nameless + named, [], [], "k1", False, 6)
    order = [record.id for record, _, _ in ranked]
    assert order[0].startswith("named-") and order.index("named-0") < order.index("nameless-0")


def test_without_labels_the_queue_labels_a_named_input_where_most_inputs_carry_a_name_whatever_the_names():
    """Push traffic in miniature: four black_friday inputs, each with another customer's name, and
    two without a name but with a deadline. No two names are the same word, so by the share of words
    alone no named input showed another's name, and a nameless one, whose deadline the other
    shares, led: its label taught copy with no name to a campaign whose inputs mostly carry one.
    Read by its shape (the campaign and the fields it fills), any named input shows a named one's
    name; so a named input leads, and shows all of another named input's shape."""
    def push(rid: str, **fields):
        task_input = {"campaign": "black_friday", "product": "mouse sem fio", "discount_pct": 20, **fields}
        return make_record(id=rid, task="push", input=task_input, raw="{}", key_id="k1", reward=Reward(0.5, {}, False))
    named = [push(f"named-{i}", customer_name=name) for i, name in enumerate(["Ana", "Bruno", "Carla", "Diego"])]
    nameless = [push(f"nameless-{i}", deadline="hoje") for i in range(2)]
    order = [record.id for record, _, _ in rank("push", nameless + named, [], [], "k1", False, 6)]
    assert order[0].startswith("named-")
    features = [input_features("push", typed_input("push", record.input)) for record in (named[0], named[1], nameless[0])]
    assert features[0][1] == features[1][1] != features[2][1]  # the same shape, whatever the name
    similarity = similarities(features, ["n0", "n1", "d0"])
    assert similarity[0, 1] > similarity[2, 1] and similarity[0, 1] > shown(features[1][0], features[0][0])


def test_without_labels_the_queue_stands_for_every_kind_of_input_before_a_second_of_any():
    """Six answers to one campaign, three to a second and two to a third (push's traffic in
    miniature): the first three listed are one of each, the most common first; an input like a
    labelled one comes after the others."""
    def push(rid: str, campaign: str, name: str, product: str | None = None):
        task_input = {"campaign": campaign, "customer_name": name, **({"product": product} if product else {})}
        return make_record(id=rid, task="push", input=task_input, raw="{}", key_id="k1", reward=Reward(0.5, {}, False))
    names = ["Ana", "Bruno", "Carla", "Diego", "Elisa", "Fabio"]
    black_friday = [push(f"bf-{i}", "black_friday", name) for i, name in enumerate(names)]
    review = [push(f"review-{i}", "pedir_avaliacao", name, "fone de ouvido bluetooth") for i, name in enumerate(names[:3])]
    stock = [push(f"stock-{i}", "volta_ao_estoque", name, "tenis de corrida") for i, name in enumerate(names[:2])]
    records = black_friday + review + stock
    ranked = rank("push", records, [], [], "k1", False, len(records))
    order = [record.id for record, _, _ in ranked]
    assert order[0].startswith("bf-") and {rid.split("-")[0] for rid in order[:3]} == {"bf", "review", "stock"}
    priorities = [priority for _, priority, _ in ranked]
    assert priorities == sorted(priorities, reverse=True) and len(ranked) == len(records)
    why = dict((record.id, reasons) for record, _, reasons in ranked)
    assert any(reason == "representative input 1.00" for reason in why[order[0]])
    corrected = [Label(id="bf-0", task="push", input=black_friday[0].input, input_hash=input_hash("push", black_friday[0].input),
                       split="train", served="", served_version="base", time=0.0, rating=None,
                       answer={"title": "t", "body": "b"}, answer_source="correction")]
    after = [record.id for record, _, _ in rank("push", records, corrected, [], "k1", False, len(records))]
    assert "bf-0" not in after and not after[0].startswith("bf-")  # that campaign has its label: the others come first
    assert {rid.split("-")[0] for rid in after[:2]} == {"review", "stock"}


def test_with_few_labels_a_typical_input_leads_and_with_many_a_low_score_does():
    """A label teaches the inputs like its own. While a task has few labels, an answer to an
    input like the others' comes before a lower-scored odd one, and one of that family is enough
    before the odd one; once the task has many labels, the low score leads."""
    family = [served(f"family-{i}", 0.6, f"quantos pedidos foram entregues em sao paulo no ano {2016 + i}") for i in range(4)]
    typical, odd = served("typical", 0.5, "quantos pedidos foram entregues em sao paulo"), served("odd", 0.0, "qual vendedor vendeu mais cadeiras gamer")
    fresh = rank("sql", [*family, odd, typical], [], [], "k1", False, 6)
    order = [record.id for record, _, _ in fresh]
    assert order[0] != "odd" and order[1] == "odd"
    why = {record.id: reasons for record, _, reasons in fresh}
    assert "representative input 1.00" in why[order[0]]
    assert rank("sql", [*family, odd, typical], seasoned(), [], "k1", False, 6)[0][0].id == "odd"
    assert doubt_weight(0) == 0.0 and doubt_weight(COLD_START_LABELS) == 0.5 and doubt_weight(900) == pytest.approx(0.9)


def test_labelled_answers_others_keys_and_answers_from_corrections_are_left_out():
    records = [served("rated", 0.1), served("corrected", 0.1), served("liked-ref", 0.2), served("theirs", 0.1, key_id="k2"),
               served("repeat", 0.1, answered_from="corrected"), served("open", 0.5)]
    labels = [labelled("rated", rating=-1), labelled("corrected", source="correction"), labelled("liked-ref", source="reference")]
    mine = [record.id for record, _, _ in rank("sql", records, labels, [], "k1", False, 10)]
    assert mine == ["liked-ref", "open"]  # a reference sent with the request is no review
    assert [r.id for r, _, _ in rank("sql", records, labels, [], None, True, 10)] == ["theirs", "liked-ref", "open"]
    assert len(rank("sql", records, labels, [], None, True, 1)) == 1


@pytest.fixture(scope="module")
def down():
    with TestClient(app_for(None, None)) as client:
        yield client


def test_the_page_is_served_and_bad_queries_are_refused_readably(down):
    page = down.get("/review")
    assert page.status_code == 200 and "/dashboard/assets/review.js" in page.text
    assert down.get("/dashboard/assets/review.js").status_code == 200 and down.get("/dashboard/assets/review.css").status_code == 200
    assert down.get("/v1/review/poetry").status_code == 404
    for query in ("limit=0", "limit=201", "limit=x"):
        response = down.get(f"/v1/review/sql?{query}")
        assert response.status_code == 422 and response.json()["error"]["type"] == "invalid_request"
    response = down.get("/v1/review/sql")
    assert response.status_code == 503 and response.json()["error"]["type"] == "store_unavailable"


LEGACY_ROUND = {  # as rounds wrote it before the outcome was typed: the outcome in a string to split
    "round": "r20261127T210518-16e28c", "started": 1.0, "records": 202, "seconds": 53.08, "acknowledged": 202,
    "orphans_removed": [], "settings": {"train_method": "auto"},
    "tasks": {"extraction": {"labels": 180, "data": {"sft": 113, "skipped": {"eval": 4}}, "why": "180 labels new",
                             "plan": [{"method": "sft", "why": "113 supervised examples"}],
                             "start": {"from": "base", "why": "no active version"}, "status": "promoted", "reason": "paired difference +0.13",
                             "version": "extraction-v4", "method": "sft", "seconds": {"training": 20.5, "gate": 9.1},
                             "stop_conditions": {"grad_norm_spikes": {"flagged": False, "value": 0.4, "spikes": 0}},
                             "decision": {"promote": True, "reason": "paired difference +0.13", "n": 32, "rows": {"bootstrap": 32},
                                          "candidate_mean": 0.7, "incumbent_mean": 0.57, "difference": 0.13, "interval": [0.08, 0.18],
                                          "components": {"field:urgency": {"difference": 0.2, "interval": [0.1, 0.3], "worse": False}},
                                          "seconds": 9.1, "planned": 64, "looks": 2},
                             "incumbent": "base", "retired": {"checked": 24, "retired": 14, "reason": "14 of the 24"},
                             "trained_on": {"sft": ["a", "b"], "pairs": [], "kto": [], "prompts": []},
                             "training": [{"method": "sft", "why": "113", "examples": 113, "steps": 40, "epochs": 2.5, "seconds": 20.0,
                                           "stopped_by": "time budget", "last": {"loss": 0.5}}]},
              "sql": {"labels": 3, "data": {"sft": 0}, "why": "nothing new", "plan": [], "status": "not trained: nothing new"}}}


def test_rounds_are_served_with_their_documented_shape(monkeypatch):
    """/v1/rounds and /v1/rounds/{id} answer typed summaries (their fields in the OpenAPI schema,
    the outcome an enum); a summary stored before the outcome was typed reads back typed."""
    summary = decode_round(json.dumps(LEGACY_ROUND))
    assert summary.outcomes() == {"extraction": Outcome.PROMOTED, "sql": Outcome.NOT_TRAINED}
    assert summary.tasks["sql"].reason == "nothing new" and summary.tasks["extraction"].start.weights == "base"
    assert summary.tasks["extraction"].data.sources.sft == ["a", "b"]  # `trained_on` is the data's sources now
    assert summary.tasks["extraction"].gate.decision.labelled is None  # kept before the labelled check existed
    assert summary.tasks["extraction"].gate.incumbent == "base" and summary.tasks["sql"].gate is None  # nested since
    assert decode_round(encode_round(summary)) == summary
    with TestClient(app_for(None, None)) as client:
        monkeypatch.setattr(client.app.state.gateway.store, "rounds", lambda limit: [summary])
        monkeypatch.setattr(client.app.state.gateway.store, "round", lambda round_id: summary if round_id == summary.round else None)
        listed = client.get("/v1/rounds").json()["rounds"]
        one = client.get(f"/v1/rounds/{summary.round}").json()
        assert client.get("/v1/rounds/r-none").status_code == 404
        schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert listed == [one] and one["tasks"]["extraction"]["training"][0]["steps"] == 40 and one["tasks"]["sql"]["version"] is None
    assert one["tasks"]["extraction"]["outcome"] == "promoted" and one["tasks"]["sql"]["outcome"] == "not trained"
    assert one["tasks"]["extraction"]["retired"]["retired"] == 14 and one["orphans_removed"] == []
    assert one["tasks"]["extraction"]["gate"]["decision"]["components"]["field:urgency"]["interval"] == [0.1, 0.3]
    assert {"outcome", "gate", "retired", "plan"} <= set(schema["TaskOutcome"]["properties"])
    assert not {"decision", "incumbent", "shadow"} & set(schema["TaskOutcome"]["properties"])  # one shape: GateRecord
    assert schema["Outcome"]["enum"] == ["promoted", "canary", "rejected", "not trained", "failed"]
    assert schema["RoundList"]["properties"]["rounds"]["items"] == {"$ref": "#/components/schemas/RoundSummary"}
    assert schema["TaskOutcome"]["properties"]["why"]["description"].startswith("Why the task trained")


def test_with_no_labels_an_input_served_different_answers_gets_no_more_than_one_served_the_same():
    """Disagreement is doubt, and doubt waits for labels: sampled answers to an input sent twice
    always differ, so at cold start it would list the inputs sent most first, whatever their kind
    (in a push run, five of six labels went to one campaign). With no labels, an input served two
    different answers ranks as one served the same answer twice; with a task's labels, above it."""
    def traffic(second_raw: str) -> list[Record]:
        return [served("twice-1", 0.5, "quantos pedidos foram entregues em sao paulo", raw="SELECT 1"),
                served("twice-2", 0.5, "quantos pedidos foram entregues em sao paulo", raw=second_raw),
                served("other", 0.5, "qual o valor medio das parcelas pagas com boleto"),
                served("third", 0.5, "liste os vendedores do parana com mais avaliacoes ruins")]
    differ, same = traffic("SELECT 2"), traffic("SELECT 1")
    cold = [rank("sql", records, [], [], "k1", False, 10) for records in (differ, same)]
    assert [(record.id, priority) for record, priority, _ in cold[0]] == [(record.id, priority) for record, priority, _ in cold[1]]
    why = {record.id: reasons for record, _, reasons in cold[0]}
    assert "the same input was served different answers" in why["twice-1"]  # still said, only not weighed before labels
    seasoned_priority = [{record.id: priority for record, priority, _ in rank("sql", records, seasoned(), [], "k1", False, 10)}
                         for records in (differ, same)]
    assert seasoned_priority[0]["twice-1"] > seasoned_priority[1]["twice-1"]


def test_two_wordings_of_one_query_are_alike_and_the_queue_lists_each_query_before_a_second_wording():
    """SQL traffic in miniature: two queries asked in two wordings that share almost no words, and
    a third query; with no labels, the first three listed are one of each query (by words alone,
    the second wording of the commonest query came second: a label spent on what the first teaches)."""
    weight = [f"Quanto pesa, em gramas, um produto de {c} em média?" for c in ("esporte_lazer", "bebes", "moveis_decoracao", "perfumaria")]
    weight += [f"Qual o peso médio dos produtos da categoria {c}?" for c in ("telefonia_fixa", "papelaria", "automotivo")]
    orders = [f"Quantos pedidos de clientes de {uf} foram feitos em 2018?" for uf in ("TO", "SP", "RJ")]
    orders += [f"Qual o número de compras vindas de {uf} em 2017?" for uf in ("ES", "GO")]
    cities = [f"Liste as cinco cidades de {uf} que mais compraram." for uf in ("AL", "BA")]
    questions = [("weight", q) for q in weight] + [("orders", q) for q in orders] + [("cities", q) for q in cities]
    records = [served(f"{query}-{i}", 0.2, question) for i, (query, question) in enumerate(questions)]
    inputs = [{"question": q} for q in (weight[0], weight[4], orders[0], cities[0], "Quanto pesa, em gramas, um produto de bebes em média?")]
    features = [input_features("sql", typed_input("sql", i)) for i in inputs]
    assert shown(features[0][0], features[1][0]) == 0.0  # the two wordings share no content word
    similarity = similarities(features, [input_hash("sql", i) for i in inputs])
    assert similarity[0, 1] >= 0.5 > similarity[0, 2] and similarity[0, 3] == 0.0 and similarity[0, 4] > similarity[0, 1]
    unread = [{"question": "o que voce acha do site da loja"}, {"question": "o que voce acha do site novo da loja"}]
    assert all(input_features("sql", typed_input("sql", i))[1] == frozenset() for i in unread)
    words = [input_features("sql", typed_input("sql", i))[0] for i in unread]  # neither says what it asks: its words alone judge the pair
    similarity = similarities([input_features("sql", typed_input("sql", i)) for i in unread], ["h1", "h2"])
    assert similarity[0, 1] == pytest.approx(shown(words[1], words[0])) and similarity[1, 0] == pytest.approx(shown(words[0], words[1]))
    ranked = rank("sql", records, [], [], "k1", False, len(records))
    first = [record.id.split("-")[0] for record, _, _ in ranked[:3]]
    assert sorted(first) == ["cities", "orders", "weight"] and first[0] == "weight"


def test_a_group_whose_samples_scored_apart_is_doubt_and_one_whose_samples_agreed_is_not():
    from common.records import Group, Sample

    def group(totals: list[float]) -> Group:
        return Group(prompt_token_ids=[1], samples=[Sample(text=f"SELECT {i}", token_ids=[i], logprobs=[-1.0], finish_reason="stop",
                                                           valid=True, reward=Reward(t, {}, False)) for i, t in enumerate(totals)],
                     chosen=0)

    records = [served("agreed", 0.9, "a", group=group([0.9, 0.9, 0.9, 0.9])),
               served("apart", 0.9, "b", group=group([0.9, 0.1, 0.2, 0.5])),
               served("alone", 0.9, "c")]
    ranked = rank("sql", records, seasoned(), [], "k1", False, 10)
    order = [record.id for record, _, _ in ranked]
    assert order[0] == "apart", order
    why = {record.id: reasons for record, _, reasons in ranked}
    assert "its 4 samples scored 0.10 to 0.90" in why["apart"] and not any("samples" in r for r in why["agreed"] + why["alone"])
    priority = {record.id: p for record, p, _ in ranked}
    assert priority["agreed"] == priority["alone"]  # samples that agree add no doubt
