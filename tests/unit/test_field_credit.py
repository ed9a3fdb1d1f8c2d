"""GRPO's per-field credit (`grpo_advantage="fields"`, `trainer.field_credit`): where each JSON
field's value lies in a completion, each field's part of a score, the per-token advantages made
of them, and a run of TRL's real trainer on a tiny model where plain GRPO pushes a field the
wrong way and the per-field credit pushes it the right way."""
from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from common.records import RewardContext, Sampling
from common.settings import load_settings
from common.tasks import EngineKind, TaskTraits
from rewards import extraction
from rewards.parsing import value_spans
from tasks import TaskDefinition, register, score, typed_input, unregister
from tests.unit.test_training_on_cpu import VOCAB, tiny_model
from trainer.data import RolloutGroup

pytestmark = pytest.mark.xdist_group("torch")  # the training test imports torch and TRL in its body
REVIEW = "O produto chegou quebrado e atrasado. Não recomendo, quero meu dinheiro de volta."


def test_value_spans_find_each_top_level_value_whatever_its_text_holds():
    text = 'ok: {"a": "x, \\"y\\" {z}", "b" : [1, {"c": 2}],\n "d":true, "e": null} trailing'
    spans = value_spans(text)
    assert {k: text[s:e] for k, (s, e) in spans.items()} == {
        "a": '"x, \\"y\\" {z}"', "b": '[1, {"c": 2}]', "d": "true", "e": "null"}


@pytest.mark.parametrize("text, found", [
    ("no object here", set()), ("{}", set()), ('{"a" 1}', set()), ('{"a": 1, "b": "cut sho', {"a"}), ('{"a": 1 "b": 2}', {"a"}),
    ('{"a": tru}', set()), ("{'a': 1}", set()),
])
def test_value_spans_stop_at_what_they_cannot_read_and_keep_what_came_before(text, found):
    assert set(value_spans(text)) == found


def _answer(**changes) -> str:
    value = {"sentiment": "negative", "sentiment_score": 1.0, "complaint_category": "defeito", "product_mentioned": None,
             "delivery_issue": True, "would_recommend": False, "urgency": "high", "key_phrases": ["chegou quebrado"],
             "summary": "Cliente recebeu produto quebrado e com atraso.", "requires_response": True}
    value.update(changes)
    return json.dumps(value, ensure_ascii=False)


@pytest.mark.parametrize("with_reference", [True, False])
def test_an_extraction_scores_field_parts_add_up_to_its_total_less_the_form(with_reference):
    reference = json.loads(_answer(delivery_issue=False, summary="Produto quebrado; cliente quer reembolso."))
    context = RewardContext(input=typed_input("extraction", {"review": REVIEW}))
    for text in (_answer(), _answer(delivery_issue=False, urgency="low"), '{"sentiment": "positive"}', "not json"):
        scored = score("extraction", text, reference if with_reference else None, context)
        parts = extraction.field_shares(scored.components, scored.weights, scored.fields)
        assert set(parts) == set(extraction.FIELD_WEIGHTS)
        whole = sum(scored.weights.values())
        form = sum(scored.weights[name] * scored.components[name] for name in ("format", "schema")) / whole
        assert sum(parts.values()) + form == pytest.approx(scored.total, abs=1e-4)


class PieceTokenizer:
    """Decodes ids to fixed pieces of text, as a real tokenizer decodes a completion."""

    def __init__(self, pieces: list[str]):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.pieces[i] for i in ids)


def _pieces(text: str, size: int = 3) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def test_a_token_belongs_to_the_value_it_overlaps_even_with_the_space_before_it():
    from trainer.field_credit import field_of

    text = '{"delivery_issue": true, "urgency": "high"}'
    spans = value_spans(text)
    names = list(spans)
    at = text.index(" true")
    assert field_of(at, at + 5, spans, names) == "delivery_issue"  # " true": one token, the space outside the value
    assert field_of(at - 2, at, spans, names) is None  # '":' before it
    assert field_of(text.index(' "high'), text.index(' "high') + 2, spans, names) == "urgency"  # ' "' opens the string
    assert field_of(0, 2, spans, names) is None


def test_each_field_token_gets_its_own_fields_change_and_the_rest_gets_the_remainder():
    import torch

    from trainer.field_credit import FieldCredit, shares

    context = RewardContext(input=typed_input("extraction", {"review": REVIEW}))
    texts = [_answer(), _answer(delivery_issue=False), "not json at all"]
    scores = [score("extraction", t, None, context) for t in texts]
    assert scores[0].total > scores[1].total  # the review complains of a late delivery: True is the right value
    pieces, rows = [], []
    for text in texts:
        rows.append(list(range(len(pieces), len(pieces) + len(_pieces(text)))))
        pieces += _pieces(text)
    width = max(map(len, rows))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    totals = torch.tensor([s.total for s in scores])
    advantages = totals - totals.mean()
    credit = FieldCredit()
    credit.scored(["extraction"] * 3, texts, scores)
    out = credit.token_advantages(advantages, ids, mask, PieceTokenizer(pieces), group_size=3)
    assert out.shape == ids.shape
    assert (credit.samples, credit.whole) == (2, 1)
    assert torch.allclose(out[2], advantages[2].expand(width))  # its fields cannot be found: the sample's advantage throughout
    parts = [shares("extraction", s) for s in scores]
    for i in (0, 1):
        spans = value_spans(texts[i])
        begin = 0
        seen = set()
        for k in range(len(rows[i])):
            end = begin + len(pieces[rows[i][k]])
            field = next((name for name, (s, e) in spans.items() if begin < e and s < end), None)
            mean = sum(p[field] for p in parts) / 3 if field else None
            expected = parts[i][field] - mean if field else float(advantages[i]) - sum(
                parts[i][n] - sum(p[n] for p in parts) / 3 for n in parts[i])
            assert out[i, k].item() == pytest.approx(expected, abs=1e-6)
            seen.add(field)
            begin = end
        assert set(spans) <= seen  # every field's value had tokens
    start, end = value_spans(texts[0])["delivery_issue"]
    delivery = next(k for k in range(len(rows[0])) if 3 * k < end and start < 3 * k + 3)
    assert out[0, delivery] > 0 > out[1, delivery]  # the right value pushed up, the wrong one down
    with pytest.raises(ValueError, match="disagree on the batch"):
        credit.token_advantages(advantages, ids, mask, PieceTokenizer(pieces), group_size=3)  # nothing scored since


class PairInput(BaseModel):
    x: str = ""


# A toy task of two JSON fields: `a` right when "1" and weighing 0.7, `b` right when "1" and weighing 0.3.
CHARS = ["<pad>", "<eos>", "<unk>", "{", "}", '"', "a", "b", ":", ",", "0", "1", " ", "p", "q", "r"]


def char_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({c: i for i, c in enumerate(CHARS)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def _pair_score(completion: str, reference, context: RewardContext, fields: dict):
    try:
        value = json.loads(completion)
    except ValueError:
        value = {}
    components = {"a": float(value.get("a") == 1), "b": float(value.get("b") == 1)}
    return components, {"a": 0.7, "b": 0.3}, {}, value


PAIR = TaskDefinition(
    name="pair",
    traits=TaskTraits(EngineKind.BASE, scored_with_reference=False, thinks=False, runs_sql=False, answer_field=None, chat_input_json=False),
    sampling=Sampling(0.7, 1.0, 16), group_temperature=0.7, input_model=PairInput, output_model=None,
    input_field="x", system_prompt="", user_message=lambda task_input: "", scorer=_pair_score,
    valid=lambda components, details, output: isinstance(output, dict), check_reference=lambda value: value,
    makers=lambda refs: {}, field_shares=lambda components, weights, fields: {n: weights[n] * components[n] for n in ("a", "b")},
)


@pytest.fixture
def pair():
    register(PAIR)
    try:
        yield
    finally:
        unregister("pair")


def _b_is_one(model, tokenizer, prompt: list[int]) -> float:
    """The policy's log-odds of "1" against "0" where `b`'s value goes, after `{"a":1,"b":`."""
    import torch

    ids = torch.tensor([prompt + tokenizer('{"a":1,"b":', add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1].float()
    return (logits[CHARS.index("1")] - logits[CHARS.index("0")]).item()


@pytest.mark.parametrize("aggregation, direction", [("sum", -1), ("fields", 1)])
def test_per_field_credit_pushes_a_field_its_own_way_where_the_total_pushes_it_the_other(pair, aggregation, direction):
    """Samples {"a":1,"b":0} (0.7) and {"a":0,"b":1} (0.3): by the total, the first is better, so
    plain GRPO raises its b=0 with its a=1; per field, b=1 is the better b and rises."""
    from peft import LoraConfig, get_peft_model

    from tests.unit.test_grpo_served_groups import logprobs_of
    from trainer import grpo

    tokenizer = char_tokenizer()
    assert tokenizer.decode(tokenizer('{"a":1,"b":0}', add_special_tokens=False)["input_ids"]) == '{"a":1,"b":0}'
    assert len(CHARS) <= VOCAB
    model = get_peft_model(tiny_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                    task_type="CAUSAL_LM"))
    prompt = tokenizer("pqr", add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    first, second = (tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in ('{"a":1,"b":0}', '{"a":0,"b":1}'))
    groups = [RolloutGroup(key=f"g{i}", source=f"g{i}", version="base", temperature=0.7, prompt_token_ids=prompt,
                           completion_ids=[first, second, first, second],
                           logprobs=[logprobs_of(model, prompt, c) for c in (first, second, first, second)],
                           reference="", context=json.dumps({})) for i in range(2)]
    before = _b_is_one(model, tokenizer, prompt)
    settings = load_settings(grpo_learning_rate=0.05, grpo_prompts_per_step=2, grpo_iterations=1, grpo_max_epochs=3,
                             train_cpu_precision="fp32", grpo_advantage=aggregation)
    outcome = grpo.train_on_groups(settings, model, tokenizer, "pair", groups, 600.0, "test", policy="base")
    after = _b_is_one(model, tokenizer, prompt)
    assert f"advantages: {aggregation}" in outcome.why
    assert (after - before) * direction > 0.1, (before, after)
    if aggregation == "fields":
        assert outcome.seconds_by_phase["field_credit_samples"] == 3 * 2 * 4  # every sample of every pass, credited
        assert outcome.seconds_by_phase["field_credit_whole"] == 0


def test_a_task_whose_answers_are_not_json_fields_trains_with_the_sum_and_its_run_says_so():
    from trainer import grpo

    aggregation, credit, said = grpo._advantages("fields", "sql")
    assert (aggregation, credit) == ("sum", None) and "sql's answers have no JSON fields" in said
    aggregation, credit, said = grpo._advantages("fields", "extraction")
    assert aggregation == said == "fields" and credit is not None
    assert grpo._advantages("gdpo", "extraction") == ("gdpo", None, "gdpo")
