"""Scores that tell the truth without a label: each answer's claims are checked against its input.
Every hole a cheap answer used to pass through is here, next to the honest answer it must lose to."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from rewards import review_cues
from rewards.sql import extract_sql
from tasks import score
from tests.unit.conftest import ctx

# --- push ---------------------------------------------------------------------------------

BACK_IN_STOCK = {"campaign": "volta_ao_estoque", "customer_name": "Ana", "product": "fone de ouvido bluetooth", "discount_pct": 15}
HONEST_COPY = {"title": "Ana, voltou ao estoque", "body": "15% off em fone de ouvido bluetooth. Garanta o seu antes que esgote de novo."}


def _push(copy: dict, context: dict = BACK_IN_STOCK):
    return score("push", json.dumps(copy, ensure_ascii=False), None, ctx("push", **context))


def test_garbled_push_copy_that_does_not_say_its_campaign_scores_low():
    """The copy a new user was served for 1.000: a garbled title, and nothing of 'back in stock'."""
    garbled = _push({"title": "Ana, tem voio pra você", "body": "15% off em fone de ouvido bluetooth. Use o estoque no carrinho e economize."})
    assert _push(HONEST_COPY).total == 1.0
    assert garbled.total < 0.3, garbled.details
    assert "voio" in garbled.details["fluency"] and garbled.components["intent"] == 0.0


def test_a_word_that_is_no_portuguese_word_halves_fluency_but_names_and_codes_are_not_words():
    typo = _push({**HONEST_COPY, "title": "Ana, voltoou ao estoque"})
    assert typo.components["fluency"] == pytest.approx(0.5) and "voltoou" in typo.details["fluency"]
    coupon = {"campaign": "cupom", "customer_name": "Xuxa", "product": "mochila", "discount_pct": 15, "coupon": "TUCANO20"}
    named = _push({"title": "Xuxa, tem cupom pra você", "body": "15% off em mochila com o cupom TUCANO20. Use e aproveite."}, coupon)
    assert named.components["fluency"] == 1.0, named.details


@pytest.mark.parametrize("copy, fault", [
    # what push-v1 of run 63 was served for 0.94 to 1.00 on held-out rows
    ({"title": "Ana, voltou ao estoque", "body": "Fone de ouvido bluetooth. Está disponível de novo. Vale até até até."}, "said twice over"),
    ({"title": "Ana, voltou ao estoque", "body": "15% off em fone de ouvido bluetooth enquanto está disponível enquanto está disponível."},
     "said twice over"),
    ({"title": "Ana, voltou ao estoque", "body": "15% off em fone de ouvido bluetooth. Garanta o seu. Prato."}, "one-word sentence"),
])
def test_repeated_words_and_stray_one_word_sentences_halve_fluency(copy, fault):
    degenerate = _push(copy)
    assert degenerate.components["fluency"] <= 0.5 and fault in degenerate.details["fluency"], degenerate.details
    assert degenerate.total < _push(HONEST_COPY).total


def test_a_name_dropped_as_its_own_sentence_addresses_nobody():
    """push-v1 of run 63 learned to end the body with the customer's name ("... Vitor.") for the
    name's credit; the product alone as a lead sentence is the house style and still counts."""
    tacked = _push({"title": "Voltou ao estoque", "body": "15% off em fone de ouvido bluetooth. Garanta o seu antes que esgote. Ana."})
    assert tacked.details["personalised"].startswith("1/2") and "'Ana'" in tacked.details["fluency"], tacked.details  # the product only
    lead = _push({"title": "Ana, voltou ao estoque", "body": "Fone de ouvido bluetooth. 15% off. Garanta o seu antes que esgote de novo."})
    assert lead.components["personalised"] == 1.0 and lead.components["fluency"] == 1.0, lead.details
    deadline = {**BACK_IN_STOCK, "deadline": "hoje"}
    said = _push({**HONEST_COPY, "body": HONEST_COPY["body"] + " Hoje."}, deadline)
    assert said.components["fluency"] == 1.0, said.details  # a fact of the campaign may stand as its own sentence


def test_copy_that_repeats_the_system_prompt_is_no_copy():
    echoed = _push({"title": "Você escreve notificações push em portug", "body": "O produto voltou ao estoque. Aproveite enquanto está disponível."})
    assert echoed.components["fluency"] == 0.0 and echoed.details["fluency"] == "the system prompt repeated"
    assert echoed.total < 0.3


def test_copy_that_says_every_campaign_misleads_and_loses_its_intent():
    review = {"campaign": "pedir_avaliacao", "customer_name": "Ana", "product": "tapete"}
    honest = _push({"title": "Ana, conta pra gente", "body": "Avalie o tapete que você recebeu em poucos segundos."}, review)
    everything = _push({"title": "Ana, conta pra gente", "body": "Preço caiu, voltou ao estoque, cupom no carrinho; avalie o tapete entregue."}, review)
    assert honest.components["intent"] == 1.0
    assert everything.components["intent"] < 0.2 and "queda_de_preco" in everything.details["intent"]
    assert everything.total < 0.5 * honest.total


def test_another_campaigns_call_to_action_misleads_too():
    """push-v2 of run 64 closed its Black Friday copy with the delivered order's call to action,
    "confira se está tudo certo com a sua compra", and was paid 0.825 for it."""
    black_friday = {"campaign": "black_friday", "product": "mouse sem fio", "discount_pct": 25}
    honest = _push({"title": "Black Friday chegou", "body": "25% off em mouse sem fio. Aproveite as ofertas só hoje."}, black_friday)
    closed = _push({"title": "Black Friday", "body": "25% off em mouse sem fio. Confira se está tudo certo com a sua compra."}, black_friday)
    tracked = _push({"title": "Black Friday", "body": "25% off em mouse sem fio. Acompanhe a entrega pelo app."}, black_friday)
    assert honest.components["intent"] == 1.0
    assert "pedido_entregue" in closed.details["intent"] and "pedido_enviado" in tracked.details["intent"]
    assert closed.components["intent"] < 0.5 and tracked.components["intent"] < 0.5
    assert max(closed.total, tracked.total) < 0.7 * honest.total
    delivered = {"campaign": "pedido_entregue", "customer_name": "Ana"}
    own = _push({"title": "Ana, pedido entregue", "body": "Seu pedido foi entregue. Confira se está tudo certo com a sua compra."}, delivered)
    assert own.components["intent"] == 1.0, own.details  # its own call to action


def test_the_discount_counts_in_full_only_when_said_as_a_discount():
    as_discount = _push(HONEST_COPY)
    bare = _push({**HONEST_COPY, "body": "Fone de ouvido bluetooth, 15% do estoque. Garanta o seu antes que esgote de novo."})
    assert as_discount.components["offer"] == 1.0 and 0 < bare.components["offer"] < 1.0


# --- extraction ----------------------------------------------------------------------------

REVIEW = "Comprei o fone de ouvido bluetooth e chegou com a caixa amassada, mas funciona bem. O som é ótimo, só demorou 12 dias."
HONEST_EXTRACTION = {"sentiment": "neutral", "sentiment_score": 3.0, "complaint_category": "delivery_delay",
                     "product_mentioned": "fone de ouvido bluetooth", "delivery_issue": True, "would_recommend": None,
                     "urgency": "low", "key_phrases": ["chegou com a caixa amassada", "só demorou 12 dias", "o som é ótimo"],
                     "summary": "Cliente gostou do som, mas a entrega atrasou e a embalagem veio danificada.",
                     "requires_response": False}


def _extraction(**changes):
    return score("extraction", json.dumps({**HONEST_EXTRACTION, **changes}, ensure_ascii=False), None, ctx("extraction", review=REVIEW))


def test_the_review_is_read_for_its_complaints_polarity_and_delivery():
    reading = review_cues.read(REVIEW)
    assert {"delivery_delay", "packaging"} <= reading.complaints and reading.positive
    assert reading.polarity == "mixed" and reading.delivery_problem
    assert review_cues.read("Produto ótimo, chegou antes do prazo. Recomendo!").polarity == "positive"
    assert review_cues.read("Não recomendo, veio quebrado.").recommends is False


@pytest.mark.parametrize("product,credit", [("fone de ouvido bluetooth", 1.0), ("fone", 0.5), ("a", 0.0), ("o fone", 0.25),
                                            ("pedido", 0.0), ("caixa amassada", 0.0), ("celular", 0.0)])
def test_the_product_is_a_whole_noun_phrase_of_the_review(product, credit):
    assert _extraction(product_mentioned=product).components["product"] == credit


@pytest.mark.parametrize("product,why", [
    ("som", None),  # a word of the review that no rule takes for the purchase: still a product
    ("dias", "names the purchase"), ("caixa", "part of a complaint"), ("12 dias", "names the purchase"),
])
def test_a_product_is_neither_a_word_of_the_purchase_nor_part_of_a_cue(product, why):
    scored = _extraction(product_mentioned=product)
    if why is None:
        assert scored.components["product"] == 1.0, scored.details["product"]
    else:
        assert scored.components["product"] == 0.0 and why in scored.details["product"], scored.details["product"]


@pytest.mark.parametrize("review,product,credit", [
    ("Gente, já passou da data prevista, ninguém informa onde está o pedido. Enfim.", "data prevista", 0.0),
    ("Olha, parece bem frágil, material muito fino. Aguardo retorno.", "material", 0.0),
    ("Comprei a furadeira de impacto e pedi outra cor.", "pedi", 0.0),
    ("Comprei a furadeira de impacto e pedi outra cor.", "furadeira de impacto", 1.0),
])
def test_what_a_review_says_of_its_delivery_or_its_material_is_not_its_product(review, product, credit):
    scored = score("extraction", json.dumps({**HONEST_EXTRACTION, "product_mentioned": product}, ensure_ascii=False), None,
                   ctx("extraction", review=review))
    assert scored.components["product"] == credit, scored.details["product"]


@pytest.mark.parametrize("review,credit", [
    ("Atendente foi grosseiro. Não recomendo. É isso.", 1.0),  # nothing but cues and discourse words
    ("Bom, cobraram duas vezes no cartão, nota fiscal não veio. Aguardo retorno.", 1.0),
    ("So veio metade do pedido, a mochila escolar nao veio na caixa.", 0.25),  # "mochila escolar" may be one
    ("Atendente foi grosseiro com o liquidificador.", 0.25),  # a word no list knows: likely a product, never sure
])
def test_no_product_is_right_only_where_the_review_names_nothing_that_could_be_one(review, credit):
    scored = score("extraction", json.dumps({**HONEST_EXTRACTION, "product_mentioned": None}, ensure_ascii=False), None,
                   ctx("extraction", review=review))
    assert scored.components["product"] == credit, scored.details["product"]


def test_an_answer_without_the_product_field_is_not_a_null_product():
    answer = {k: v for k, v in HONEST_EXTRACTION.items() if k != "product_mentioned"}
    scored = score("extraction", json.dumps(answer, ensure_ascii=False), None, ctx("extraction", review="Atendente foi grosseiro."))
    assert scored.components["product"] == 0.0, scored.details["product"]


def test_key_phrases_must_carry_the_reviews_cues_not_any_substring():
    honest = _extraction()
    substrings = _extraction(key_phrases=["o fone", "de ouvido", "e chegou"])
    assert honest.components["phrases"] > 0.9
    assert substrings.components["phrases"] == 0.0, substrings.details["phrases"]


def test_a_summary_of_the_reviews_words_reversed_or_of_a_complaint_it_does_not_make_earns_little():
    reversed_words = " ".join(reversed(REVIEW.replace(".", "").replace(",", "").split()))[:200]
    assert _extraction().components["summary"] == 1.0
    assert _extraction(summary=reversed_words).components["summary"] == 0.0
    wrong = _extraction(summary="Cliente recebeu o fone quebrado, com defeito.")
    assert wrong.components["summary"] < 0.2, wrong.details["summary"]


def test_sentiment_and_category_follow_the_review():
    assert _extraction(sentiment="positive").components["sentiment_cue"] == 0.5  # a mixed review
    praise = "Produto de ótima qualidade, chegou antes do prazo. Recomendo!"
    said = lambda **c: score("extraction", json.dumps({**HONEST_EXTRACTION, **c}, ensure_ascii=False), None, ctx("extraction", review=praise))
    assert said(sentiment="negative").components["sentiment_cue"] == 0.0
    assert said(sentiment="positive").components["sentiment_cue"] == 1.0
    assert said(complaint_category="none").components["category_cue"] == 1.0
    assert said(complaint_category="product_defect").components["category_cue"] == 0.0
    assert _extraction(complaint_category="wrong_item").components["category_cue"] == 0.0


def _read(review: str, **changes):
    return score("extraction", json.dumps({**HONEST_EXTRACTION, **changes}, ensure_ascii=False), None, ctx("extraction", review=review))


def test_each_field_is_judged_by_what_the_review_says_of_it_and_weighs_what_it_weighs_with_a_reference():
    """Version 8: the booleans, the score and the urgency are each paid at their reference weight,
    not inside one shared check a policy could trade them within."""
    from rewards.extraction import FIELD_JUDGES, FIELD_WEIGHTS, TOTAL_FIELD_WEIGHT, WEIGHTS_WITH_REFERENCE, WEIGHTS_WITHOUT_REFERENCE

    for field, (name, _) in FIELD_JUDGES.items():
        assert WEIGHTS_WITHOUT_REFERENCE[name] == pytest.approx(WEIGHTS_WITH_REFERENCE["content"] * FIELD_WEIGHTS[field] / TOTAL_FIELD_WEIGHT)
    assert sum(WEIGHTS_WITHOUT_REFERENCE.values()) == pytest.approx(1.0)
    # a late delivery softened by praise: no answer owed, low urgency, null recommendation, a middling score
    honest = _extraction()
    assert all(honest.components[c] == 1.0 for c in ("delivery_cue", "response_cue", "urgency_cue", "recommend_cue", "score_cue"))
    assert _extraction(delivery_issue=False).components["delivery_cue"] == 0.0
    assert _extraction(requires_response=True).components["response_cue"] == 0.0
    assert _extraction(urgency="high").components["urgency_cue"] == 0.0
    assert _extraction(would_recommend=True).components["recommend_cue"] == 0.0
    assert _extraction(sentiment_score=1.0).components["score_cue"] == 0.25  # 1.5 points under 2.5-3.5
    # a strong complaint alone waits for an answer
    broken = "Não recomendo, veio quebrado."
    assert review_cues.read(broken).needs_answer and not review_cues.read(REVIEW).needs_answer
    assert _read(broken, requires_response=True, urgency="high", would_recommend=False).components["response_cue"] == 1.0
    assert _read(broken, urgency="high").components["urgency_cue"] == 1.0
    assert _read(broken, urgency="low").components["urgency_cue"] == 0.0
    assert _read(broken, would_recommend=False).components["recommend_cue"] == 1.0
    assert _read(broken, delivery_issue=True).components["delivery_cue"] == 0.0  # broken, not late
    # words that say nothing decide nothing: half credit, never full
    silent = "Recebi a encomenda ontem."
    assert review_cues.read(silent).polarity is None
    assert {c: _read(silent).components[c] for c in ("delivery_cue", "response_cue", "urgency_cue", "score_cue")} == dict.fromkeys(
        ("delivery_cue", "response_cue", "urgency_cue", "score_cue"), 0.5)
    # a field of the wrong type earns nothing
    for field, name in (("delivery_issue", "delivery_cue"), ("requires_response", "response_cue"), ("urgency", "urgency_cue"),
                        ("would_recommend", "recommend_cue"), ("sentiment_score", "score_cue")):
        assert _extraction(**{field: "sim"}).components[name] == 0.0


def test_flipping_one_boolean_costs_its_weight_whatever_the_other_fields_say():
    """The trade run 46's candidates made (delivery_issue wrong, other checks right) now costs the
    field's own share: in version 7 it was one check of up to eight inside a 0.2 share."""
    from rewards.extraction import WEIGHTS_WITHOUT_REFERENCE

    honest, flipped = _extraction(), _extraction(delivery_issue=False)
    lost = honest.total - flipped.total
    assert lost >= WEIGHTS_WITHOUT_REFERENCE["delivery_cue"] - 1e-3
    traded = _extraction(delivery_issue=False, urgency="high", requires_response=True)
    assert traded.total < flipped.total < honest.total


def test_more_than_five_key_phrases_do_not_beat_five_with_a_reference():
    phrases = ["chegou com a caixa amassada", "funciona bem", "o som é ótimo", "só demorou 12 dias", "fone de ouvido"]
    five = score("extraction", json.dumps({**HONEST_EXTRACTION, "key_phrases": phrases}, ensure_ascii=False),
                 {**HONEST_EXTRACTION, "key_phrases": phrases + ["caixa", "amassada"]}, ctx("extraction", review=REVIEW))
    seven = score("extraction", json.dumps({**HONEST_EXTRACTION, "key_phrases": phrases + ["caixa", "amassada"]}, ensure_ascii=False),
                  {**HONEST_EXTRACTION, "key_phrases": phrases + ["caixa", "amassada"]}, ctx("extraction", review=REVIEW))
    assert not seven.valid and seven.total <= five.total


# --- sql -------------------------------------------------------------------------------------

CITIES_OF_MS = "Liste as cinco cidades de MS que mais compraram."


def _sql(query: str, question: str = CITIES_OF_MS, **limits):
    return score("sql", query, None, replace(ctx("sql", question=question), **limits))


def test_a_query_shaped_like_an_answer_that_answers_nothing_scores_low():
    stuffed = _sql("SELECT customer_state, COUNT(*), AVG(price), SUM(price) FROM orders_enriched WHERE customer_state NOT IN ('MS') "
                   "GROUP BY customer_state ORDER BY 2 DESC LIMIT 5")
    honest = _sql("SELECT customer_city, COUNT(*) AS n FROM orders_enriched WHERE customer_state = 'MS' "
                  "GROUP BY customer_city ORDER BY n DESC LIMIT 5")
    assert stuffed.total < 0.3, stuffed.details
    assert "missing ['ms']" in stuffed.details["question_match"] and "its rows are not" in stuffed.details["question_match"]
    assert honest.components["question_match"] == 1.0, honest.details


def test_values_count_only_with_the_operator_the_question_means():
    above = "Quantos itens custam acima de 100?"
    right = _sql("SELECT COUNT(*) FROM olist_order_items_dataset WHERE price > 100", above)
    wrong = _sql("SELECT COUNT(*) FROM olist_order_items_dataset WHERE price < 100", above)
    assert right.components["question_match"] == 1.0 and wrong.components["question_match"] < 0.5
    excluded = "Quantos clientes não são de SP?"
    assert _sql("SELECT COUNT(*) FROM olist_customers_dataset WHERE customer_state != 'SP'", excluded).components["question_match"] == 1.0
    year_as_limit = _sql("SELECT COUNT(*) FROM olist_orders_dataset LIMIT 2017", "Quantos pedidos foram feitos em 2017?")
    assert year_as_limit.components["question_match"] == 0.0


def test_the_result_must_have_the_shape_the_question_asks_for():
    one_figure = "Quantos pedidos existem no total?"
    assert _sql("SELECT COUNT(*) FROM olist_orders_dataset", one_figure).components["result_shape"] == 1.0
    per_status = _sql("SELECT order_status, COUNT(*) FROM olist_orders_dataset GROUP BY order_status", one_figure)
    assert per_status.components["result_shape"] < 0.5, per_status.details
    empty = _sql("SELECT COUNT(*) FROM olist_orders_dataset WHERE order_status = 'nada' GROUP BY order_status",
                 "Quantos pedidos há por status?")
    assert empty.components["result_shape"] == 0.0 and empty.details["result_shape"] == "empty or NULL result"


def test_errors_and_time_outs_score_below_any_query_that_runs():
    question = "Quantos clientes são do estado SP?"
    runs_ignoring_the_question = _sql("SELECT 1", question).total
    errors = _sql("SELECT COUNT(*) FROM olist_orders_dataset WHERE customer_state = 'SP'", question)
    times_out = _sql("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM olist_customers_dataset, n "
                     "WHERE customer_state = 'SP'", question, timeout_s=0.05)
    assert errors.details["executes"].startswith("error") and times_out.details["executes"] == "error: time limit exceeded"
    assert max(errors.total, times_out.total) < runs_ignoring_the_question


def test_a_long_completion_is_read_only_as_far_as_a_query_goes():
    junk = "SELECT COUNT(*) FROM olist_orders_dataset\n" + "\n".join(["x = 1 + foo bar"] * 100_000)
    sql, wrapped = extract_sql(junk)
    assert sql == "SELECT COUNT(*) FROM olist_orders_dataset" and wrapped
    long_line = extract_sql("SELECT " + "a, " * 50_000 + "b FROM olist_orders_dataset")[0]
    assert len(long_line) <= 4_000


def test_a_reference_that_fails_is_undecided_and_is_run_again_next_time():
    slow = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000) SELECT COUNT(*) FROM n")
    answer = "SELECT 300000"
    first = score("sql", "SELECT COUNT(*) FROM olist_orders_dataset", {"sql": slow}, replace(ctx(), timeout_s=0.001))
    assert first.components["reference_ran"] == 0.0 and "the reference failed" in first.details["execution_match"]
    second = score("sql", "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000) SELECT COUNT(i) FROM n",
                   {"sql": slow}, replace(ctx(), timeout_s=30.0))
    assert second.components["reference_ran"] == 1.0 and second.components["execution_match"] == 1.0, second.details
    assert score("sql", answer, {"sql": slow}, replace(ctx(), timeout_s=30.0)).components["execution_match"] == 0.0  # a constant


# --- insights --------------------------------------------------------------------------------

STATES = {"question": "Quais estados vendem mais?", "columns": ["estado", "receita"],
          "rows": [["SP", 293568.79], ["RJ", 86627.69], ["MG", 82682.02], ["PR", 41000.5]]}
TRUE_ANALYSIS = ("<think>\nSP lidera.\n</think>\n\nResumo: entre os 4 registros, SP lidera com receita de 293.568,79, "
                 "à frente de RJ (86.627,69).\n- MG soma 82.682,02.\n- Na outra ponta, PR tem 41.000,50.\n"
                 "Recomendação: priorizar campanhas em SP e testar frete menor em PR.")


def test_true_claims_about_the_data_are_paid_in_full():
    result = score("insights", TRUE_ANALYSIS, None, ctx("insights", **STATES))
    assert result.details["claims"] == "4 true, 0 false" and result.total > 0.9, result.details


@pytest.mark.parametrize("false,why", [
    (("SP lidera com", "PR lidera com"), "PR is max"),  # the smallest row called the leader
    (("entre os 4 registros", "entre os 3 registros"), "says 3 registros"),
    (("à frente de RJ", "atrás de RJ"), "SP behind RJ"),
])
def test_a_false_claim_costs_more_than_no_claim(false, why):
    claimed = score("insights", TRUE_ANALYSIS.replace(*false), None, ctx("insights", **STATES))
    assert why in claimed.details["claims"]
    silent = score("insights", "<think>\nOs dados.\n</think>\n\nReceita por estado:\n- SP tem 293.568,79.\n- RJ tem 86.627,69.\n"
                   "- MG tem 82.682,02.\nRecomendação: priorizar campanhas em SP.", None, ctx("insights", **STATES))
    assert claimed.total < silent.total < score("insights", TRUE_ANALYSIS, None, ctx("insights", **STATES)).total


def test_a_figure_must_sit_beside_the_row_it_belongs_to():
    moved = TRUE_ANALYSIS.replace("- MG soma 82.682,02.", "- MG soma 86.627,69.")
    result = score("insights", moved, None, ctx("insights", **STATES))
    assert "beside the wrong row" in result.details["grounding"] and result.components["grounding"] < 1.0


def test_the_grpo_reward_does_not_remember_an_undecided_score():
    from trainer import grpo_reward as trl

    slow = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000) SELECT COUNT(*) FROM n"
    answer = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000) SELECT COUNT(i) FROM n"
    reference, hurried, patient = json.dumps({"sql": slow}), replace(ctx(), timeout_s=0.001).to_json(), replace(ctx(), timeout_s=30.0).to_json()
    assert trl._score("sql", answer, reference, hurried).components["reference_ran"] == 0.0
    assert (("sql", answer, reference, hurried)) not in trl._SCORES
    assert trl._score("sql", answer, reference, patient).components["execution_match"] == 1.0
    assert ("sql", answer, reference, patient) in trl._SCORES
