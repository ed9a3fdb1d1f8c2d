"""The promotion decisions as pure functions: the gate's paired interval (a candidate that is the
incumbent's own weights is never promoted; a clearly better one is; one with a significantly
worse field is not), its looks (a plain outcome stops early; the false promotions and the power
of the fixed sample are kept), the canary's verdict on live records, the stop conditions, KTO's
class weights."""
from __future__ import annotations

import asyncio
import json
import random

import pytest

from common.records import Feedback, Label, Reward
from common.rounds import StopCondition
from common.settings import load_settings
from common.stats import mean_interval
from common.tasks import ExtractionInput, PushInput
from rewards import Score
from tasks import typed_input
from tests.unit.test_shapes_and_routing import make_record
from trainer import canary, gate
from trainer.diagnostics import stop_conditions
from trainer.gate import EvalRow, decide, look_ends, row_seed, sample_rows, sequential

SETTINGS = load_settings(gate_min_rows=16, promote_margin=0.0, component_tolerance=0.01)


def rows(n: int) -> list[EvalRow]:
    return [EvalRow(f"row-{i}", ("team", "bootstrap")[i % 2], ExtractionInput(review=f"r{i}"), {}) for i in range(n)]


def scored(total: float, **fields) -> Score:
    return Score(total, {"content": total, "format": 1.0}, True, True, fields=fields)


def answers(rng: random.Random, n: int, shift: float = 0.0) -> list[Score]:
    return [scored(min(1.0, max(0.0, rng.uniform(0.3, 0.9) + shift)), sentiment=1.0) for _ in range(n)]


@pytest.mark.parametrize("repetition", range(20))
def test_the_incumbents_own_weights_under_a_new_name_are_never_promoted(repetition):
    """Same weights, same rows, same seeds: every row answers alike, whatever the seed."""
    rng = random.Random(repetition)
    incumbent = answers(rng, 60)
    decision = decide(list(incumbent), incumbent, rows(60), SETTINGS, seed=repetition)
    assert not decision.promote and decision.interval == (0.0, 0.0)


def test_noise_alone_is_not_promoted_where_a_mean_rule_would():
    """Two draws of the same distribution: the old rule (mean gain > 0.01) promotes about half of
    them; the interval promotes (almost) none."""
    old_rule = new_rule = 0
    for repetition in range(40):
        rng = random.Random(1000 + repetition)
        incumbent, candidate = answers(rng, 48), answers(rng, 48)
        old_rule += sum(c.total for c in candidate) / 48 - sum(i.total for i in incumbent) / 48 > 0.01
        new_rule += decide(candidate, incumbent, rows(48), SETTINGS, seed=repetition).promote
    assert old_rule >= 10 and new_rule <= 2


def test_a_clearly_better_candidate_is_promoted_with_its_interval_and_sources():
    rng = random.Random(7)
    incumbent = answers(rng, 60)
    candidate = [scored(min(1.0, i.total + 0.1), sentiment=1.0) for i in incumbent]
    decision = decide(candidate, incumbent, rows(60), SETTINGS)
    assert decision.promote and decision.interval[0] > 0 and decision.rows == {"team": 30, "file": 0, "bootstrap": 30}
    assert decision.n == 60 and "interval" in decision.reason


def test_the_default_margin_turns_away_a_sure_gain_too_small_to_be_one():
    """Run 45's sql-v3 in small: 64 rows, most alike, a few a little better. The gate is sure of the
    gain (its interval lies above 0), and with the default margin of 0.01 it is still rejected;
    three times that gain on the same rows is promoted."""
    defaults = load_settings()
    assert defaults.promote_margin == 0.01
    rng = random.Random(45)
    incumbent = answers(rng, 64)
    better = set(rng.sample(range(64), 12))

    def lifted(by: float) -> list[Score]:
        return [scored(min(1.0, i.total + (by if k in better else 0.0)), sentiment=1.0) for k, i in enumerate(incumbent)]

    small = decide(lifted(0.04), incumbent, rows(64), defaults)
    assert 0.0 < small.interval[0] <= 0.01 and not small.promote, small
    assert "does not clear the margin 0.01" in small.reason
    assert decide(lifted(0.04), incumbent, rows(64), SETTINGS).promote  # a margin of 0 promotes it
    assert decide(lifted(0.12), incumbent, rows(64), defaults).promote


def test_a_significantly_worse_field_blocks_a_better_total():
    rng = random.Random(8)
    incumbent = answers(rng, 60)
    candidate = [Score(min(1.0, i.total + 0.1), i.components, True, True, fields={"sentiment": 0.0}) for i in incumbent]
    decision = decide(candidate, incumbent, rows(60), SETTINGS)
    assert not decision.promote and "field:sentiment" in decision.reason
    assert decision.components["field:sentiment"].worse and not decision.components["content"].worse


def test_too_few_rows_decide_nothing():
    incumbent = answers(random.Random(9), 8)
    decision = decide([scored(1.0)] * 8, incumbent, rows(8), SETTINGS)
    assert not decision.promote and "fewer than the 16" in decision.reason


def test_rows_rotate_between_rounds_and_seeds_are_shared_by_the_versions_compared():
    many = rows(500)
    first, second = sample_rows(many, 100, seed=1), sample_rows(many, 100, seed=2)
    assert len(first) == len(second) == 100 and first != second and first[:10] != many[:10]
    reordered = sample_rows(rows(50), 100, seed=1)
    assert reordered != rows(50) and sorted(reordered, key=lambda r: int(r.id[4:])) == rows(50)
    assert reordered[:25] != [r for r in rows(50) if r.source == "team"]  # a first look sees both sources
    assert row_seed(1, "row-1") == row_seed(1, "row-1") != row_seed(2, "row-1")
    mean, low, high = mean_interval([0.1] * 30)
    assert mean == pytest.approx(0.1) and low == pytest.approx(0.1) and high == pytest.approx(0.1)


def run_looks(candidate: list[Score], incumbent: list[Score], settings=SETTINGS, seed: int = 0):
    """The gate's sequential loop over scores known in advance; returns its decision and the rows
    it asked to have scored."""
    asked: list[int] = []

    async def score_block(block):
        start = sum(asked)
        asked.append(len(block))
        return candidate[start:start + len(block)], incumbent[start:start + len(block)]
    decision = asyncio.run(sequential(score_block, rows(len(candidate)), settings, seed))
    return decision, asked


def test_looks_are_blocks_of_the_sample_and_one_look_when_the_block_is_the_sample():
    assert look_ends(64, 32) == [32, 64] and look_ends(70, 32) == [32, 64, 70] and look_ends(100, 16)[-1] == 100
    assert look_ends(24, 32) == [24] and look_ends(64, 0) == [64] and look_ends(64, 64) == [64]


def test_a_plain_win_and_a_plain_loss_stop_at_the_first_look():
    rng = random.Random(11)
    incumbent = answers(rng, 64)
    better = [scored(min(1.0, i.total + 0.3), sentiment=1.0) for i in incumbent]
    won, asked = run_looks(better, incumbent)
    assert won.promote and asked == [32] and won.n == 32 and won.planned == 64 and won.looks == 1
    assert "stopped after 32 of 64 rows" in won.reason and "99.73%" in won.reason
    assert won.planned == 64 and won.n == 32
    worse = [scored(max(0.0, i.total - 0.1), sentiment=1.0) for i in incumbent]
    lost, asked = run_looks(worse, incumbent)
    assert not lost.promote and asked == [32] and "not above the margin" in lost.reason


def test_a_close_call_goes_to_the_last_look_and_is_decided_there_as_a_fixed_sample_would_be():
    rng = random.Random(14)
    incumbent = answers(rng, 64)
    # +0.06 on average, noisy: clear at 64 rows, not at z = 3 after 32
    candidate = [scored(min(1.0, max(0.0, i.total + 0.06 + rng.uniform(-0.3, 0.3))), sentiment=1.0) for i in incumbent]
    decision, asked = run_looks(candidate, incumbent)
    fixed = decide(candidate, incumbent, rows(64), SETTINGS)
    assert asked == [32, 32] and decision.looks == 2 and decision.n == 64
    assert decision.promote and (decision.reason, decision.interval) == (fixed.reason, fixed.interval)


def test_a_field_drifting_worse_keeps_an_early_win_from_stopping_the_gate():
    rng = random.Random(13)
    incumbent = answers(rng, 64)
    drifting = [Score(min(1.0, i.total + 0.3), i.components, True, True, fields={"sentiment": 0.9 if k % 3 else 1.0})
                for k, i in enumerate(incumbent)]  # sentiment 0.07 worse on average: beyond the tolerance 0.01
    decision, asked = run_looks(drifting, incumbent)
    assert asked == [32, 32] and decision.n == 64


def test_looking_early_keeps_false_promotions_and_power_of_the_fixed_sample():
    """100 gates on noise alone and 100 on a modest true gain (+0.05), each decided with looks and
    on the fixed 64 rows: the looks promote noise no more often, lose little power, and stop most
    of the gates on noise at the first look."""
    looked = {"noise": 0, "gain": 0}
    fixed = {"noise": 0, "gain": 0}
    stopped_early = 0
    for repetition in range(100):
        rng = random.Random(5000 + repetition)
        incumbent = answers(rng, 64)
        for kind, shift in (("noise", 0.0), ("gain", 0.05)):
            candidate = answers(rng, 64, shift)
            decision, asked = run_looks(candidate, incumbent, seed=repetition)
            looked[kind] += decision.promote
            fixed[kind] += decide(candidate, incumbent, rows(64), SETTINGS, seed=repetition).promote
            stopped_early += kind == "noise" and asked == [32]
    assert looked["noise"] <= fixed["noise"] + 1 and looked["noise"] <= 5  # 5% of 100 would be 5
    assert fixed["gain"] >= 20 and looked["gain"] >= fixed["gain"] - 0.1 * 100
    assert stopped_early >= 40


def live(arm: str, adapter: str | None, total: float, rating: int | None = None):
    record = make_record(arm=arm, adapter=adapter, reward=Reward(total, {}, False))
    record.feedback = Feedback(rating, 0.0) if rating is not None else None
    return record


def test_a_worse_canary_is_rolled_back_and_a_good_one_promoted():
    rng = random.Random(3)
    active = [live("active", "sql-v1", rng.uniform(0.5, 0.9)) for _ in range(60)]
    worse = active + [live("canary", "sql-v2", rng.uniform(0.1, 0.4)) for _ in range(40)]
    verdict = canary.judge(worse, "sql-v2", started=0.0, min_requests=30, max_minutes=60, now=60.0)
    assert verdict.action == "rollback" and verdict.record.reward_difference < -0.3
    good = active + [live("canary", "sql-v2", rng.uniform(0.55, 0.95)) for _ in range(40)]
    assert canary.judge(good, "sql-v2", 0.0, 30, 60, now=60.0).action == "promote"
    early = active + [live("canary", "sql-v2", 0.9) for _ in range(10)]
    assert canary.judge(early, "sql-v2", 0.0, 30, 60, now=60.0).action == "wait"
    assert canary.judge(early, "sql-v2", 0.0, 30, 60, now=3601.0).action == "rollback"  # out of time, too little traffic


def test_a_canary_rated_worse_is_rolled_back_even_at_equal_reward():
    rated = [live("active", "sql-v1", 0.7, 1) for _ in range(40)] + [live("canary", "sql-v2", 0.7, -1) for _ in range(40)]
    verdict = canary.judge(rated, "sql-v2", 0.0, 30, 60, now=60.0)
    assert verdict.action == "rollback" and "ratings" in verdict.reason


def test_stop_conditions_flag_what_they_say():
    grpo = [{"grad_norm": 0.5, "entropy": 1.0, "completions/clipped_ratio": 0.5},
            {"grad_norm": 3.0, "entropy": 0.3, "completions/clipped_ratio": 0.4},
            {"generation_batch": 0, "reward_total": 0.4, "zero_variance_share": 0.75},
            {"generation_batch": 1, "reward_total": 0.4, "zero_variance_share": 0.5}]
    flags = stop_conditions({"grpo": grpo, "sft": [{"grad_norm": 0.2}]})
    assert all(flag.flagged for flag in flags.values()) and set(flags) == {
        "length_ceiling", "zero_variance_groups", "grad_norm_spikes", "flat_reward", "entropy_collapse"}
    calm = stop_conditions({"sft": [{"grad_norm": 0.2}, {"grad_norm": 0.3}]})
    assert calm == {"grad_norm_spikes": StopCondition(flagged=False, value=0.3, spikes=0)}


@pytest.mark.xdist_group("torch")  # trainer.kto imports TRL's side of the trainer (tests/unit/conftest.py)
@pytest.mark.parametrize("good,bad", [(10, 40), (40, 10), (20, 20), (0, 5)])
def test_kto_class_weights_keep_the_weighted_ratio_within_one_and_four_thirds(good, bad):
    from trainer.kto import class_weights

    desirable, undesirable = class_weights(good, bad)
    if good and bad:
        assert 1.0 <= desirable * good / (undesirable * bad) <= 4 / 3 + 1e-9
    else:
        assert (desirable, undesirable) == (1.0, 1.0)


class DictStore:
    """The answer-cache calls of `Store`, over a dict (the real one is exercised against Valkey
    in tests/integration/test_promotion.py)."""

    def __init__(self):
        self.scopes: dict[str, dict[str, str]] = {}
        self.numerics = "cpu-fp32"

    def engine_numerics(self, kind):
        return self.numerics

    def cached_answers(self, scope, keys):
        return [self.scopes.get(scope, {}).get(key) for key in keys]

    def cache_answers(self, scope, answers):
        self.scopes.setdefault(scope, {}).update(answers)

    alone: frozenset[str] = frozenset()  # versions whose gate chose to serve them without the examples

    def shows_examples(self, version):
        return version not in self.alone


class CountingPool:
    """An engine pool that answers every push request with the same copy and counts the requests."""

    kind = "base"

    def __init__(self):
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast

        from router.engine_client import ChatTemplate

        tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"x": 0}, unk_token="x")))
        tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
        self.template = ChatTemplate(tokenizer)
        self.asked: list[tuple[str | None, int]] = []

    async def check(self):
        return True

    async def complete(self, prompt, version, sampling, json_schema):
        from types import SimpleNamespace

        self.asked.append((version, sampling.seed))
        return SimpleNamespace(text='{"title": "Ana, seu carrinho te espera", "body": "Fone com 10% off. Finalize sua compra."}')

    async def complete_group(self, prompt, version, sampling, json_schema):
        """A group of `sampling.n` in one request, each sample as `complete` answers."""
        return [await self.complete(prompt, version, sampling, json_schema)] * sampling.n


@pytest.mark.xdist_group("torch")
def test_an_unchanging_models_answers_are_read_back_and_only_new_requests_asked(tmp_path):
    import asyncio

    from trainer import gate

    settings = load_settings(data_dir=tmp_path)
    push_rows = [EvalRow(f"row-{i}", "bootstrap", PushInput(campaign="carrinho_abandonado", customer_name=f"Ana{i}"), None)
                 for i in range(6)]
    store, pool = DictStore(), CountingPool()
    first = asyncio.run(gate.answer(pool, settings, "push", "push-v1", push_rows[:4], settings.seed, store))
    again = asyncio.run(gate.answer(pool, settings, "push", "push-v1", push_rows, settings.seed, store))
    assert [s.total for s in again[:4]] == [s.total for s in first]
    assert len(pool.asked) == 6  # 4, then only the 2 rows not answered before
    asyncio.run(gate.answer(pool, settings, "push", "push-v2", push_rows[:2], settings.seed, store))
    asyncio.run(gate.answer(pool, settings, "push", "push-v1", push_rows[:2], settings.seed + 1, store))
    assert len(pool.asked) == 10  # another version, or other seeds, are other requests
    asyncio.run(gate.answer(pool, settings, "push", "push-v1", push_rows[:2], settings.seed, None))
    assert len(pool.asked) == 12  # without a store nothing is read back
    store.numerics = "cpu-bf16"  # the engines now compute in another precision: their answers are another model's
    asyncio.run(gate.answer(pool, settings, "push", "push-v1", push_rows[:4], settings.seed, store))
    assert len(pool.asked) == 16
    asyncio.run(gate.answer(pool, settings, "push", "push-v1", push_rows[:4], settings.seed, store))
    assert len(pool.asked) == 16
    scopes = {gate.model_scope(path, version, numerics) for path in (str(tmp_path), "/elsewhere") for version in (None, "push-v1")
              for numerics in ("cpu-fp32", "cpu-bf16", "cuda")}
    assert len(scopes) == 12
    before = gate.model_scope(str(tmp_path), None, "cpu-fp32")
    (tmp_path / "config.json").write_text("{}")  # a checkpoint rebuilt at the same path is another model
    assert gate.model_scope(str(tmp_path), None, "cpu-fp32") != before


class GroupPool(CountingPool):
    """Answers a group with one good copy among poor ones, after them; a single request with the first poor one."""

    def __init__(self):
        super().__init__()
        self.samplings = []

    async def complete(self, prompt, version, sampling, json_schema):
        from types import SimpleNamespace

        self.samplings.append(sampling)
        return SimpleNamespace(text=POOR_COPY)

    async def complete_group(self, prompt, version, sampling, json_schema):
        from types import SimpleNamespace

        self.samplings.append(sampling)
        return [SimpleNamespace(text=POOR_COPY)] * (sampling.n - 1) + [SimpleNamespace(text=json.dumps(GOOD_COPY, ensure_ascii=False))]


@pytest.mark.xdist_group("torch")
def test_a_task_served_as_the_best_of_n_is_judged_by_the_sample_serving_picks(tmp_path):
    """Push is served as the best of 4 by the served score: the gate asks each row for a group of
    4 at push's temperature in one request, and scores that pick with the reference. Served as one
    sample, it is judged on one."""
    from tasks import definition, score

    rows_ = [EvalRow(f"row-{i}", "bootstrap", PushInput(campaign="carrinho_abandonado", customer_name="Ana", product="fone"),
                     GOOD_COPY) for i in range(3)]
    context = load_settings(data_dir=tmp_path).reward_context(rows_[0].input)
    good, poor = (score("push", text, GOOD_COPY, context).total for text in (json.dumps(GOOD_COPY, ensure_ascii=False), POOR_COPY))
    assert good > poor

    settings, pool, store = load_settings(data_dir=tmp_path), GroupPool(), DictStore()
    groups: list = []
    scores = asyncio.run(gate.answer(pool, settings, "push", "push-v1", rows_, settings.seed, store, groups=groups))
    assert [s.total for s in scores] == [good] * 3
    assert [(s.n, s.temperature) for s in pool.samplings] == [(4, definition("push").sampling.temperature)] * 3
    # every sample the pick was made from, the pick last as the engine returned it
    assert groups == [[POOR_COPY] * 3 + [json.dumps(GOOD_COPY, ensure_ascii=False)]] * 3
    read_back: list = []
    asyncio.run(gate.answer(pool, settings, "push", "push-v1", rows_, settings.seed, store, groups=read_back))
    assert read_back == [[json.dumps(GOOD_COPY, ensure_ascii=False)]] * 3 and len(pool.samplings) == 3  # only the pick was kept

    single = load_settings(data_dir=tmp_path, serve_samples={"push": 1})
    groups = []
    scores = asyncio.run(gate.answer(pool, single, "push", "push-v1", rows_, settings.seed, store, groups=groups))
    assert [s.total for s in scores] == [poor] * 3  # another sampling is another request: nothing read back from the groups
    assert [s.n for s in pool.samplings[3:]] == [1] * 3
    assert groups == [[POOR_COPY]] * 3


@pytest.mark.xdist_group("torch")
def test_shadow_replay_answers_a_group_served_input_with_a_group_as_it_was_served(tmp_path):
    """The incumbent's record is the pick of a group of 4: the candidate answers with a group of
    4 too, its pick by the served score, not with one sample against another's best of four."""
    from common.records import Sampling
    from trainer import shadow

    served = json.dumps(GOOD_COPY, ensure_ascii=False)
    records = [make_record(id=f"p{i}", task="push", input={"campaign": "carrinho_abandonado", "customer_name": f"Bia{i}", "product": "fone"},
                           raw=served, sampling=Sampling(0.7, 0.95, 160, 11, n=4)) for i in range(12)]
    settings, pool = load_settings(data_dir=tmp_path), GroupPool()
    replayed = asyncio.run(shadow.replay(pool, settings, "push", "push-v2", records, 3))
    assert not replayed.worse and replayed.interval == (0.0, 0.0)
    assert {(s.n, s.temperature, s.seed) for s in pool.samplings} == {(4, 0.7, 11)}


# --- decisions on the team's labels, where there are enough -------------------------------------

def scores(values: list[float]) -> list[Score]:
    return [Score(v, {}, True, True) for v in values]


def test_a_reference_free_gain_the_labels_do_not_match_is_named_and_fails():
    rng = random.Random(9)
    free_incumbent = scores([rng.uniform(0.3, 0.5) for _ in range(30)])
    free_candidate = scores([s.total + 0.4 for s in free_incumbent])  # the served score says +0.4
    incumbent = scores([rng.uniform(0.4, 0.6) for _ in range(30)])
    flat = scores([s.total + rng.uniform(-0.02, 0.02) for s in incumbent])  # the labels say nothing changed
    check = gate.labelled_check(free_candidate, free_incumbent, flat, incumbent, SETTINGS)
    assert check.checked and not check.matched and "not matched" in check.reason
    real = scores([s.total + 0.35 for s in incumbent])
    assert gate.labelled_check(free_candidate, free_incumbent, real, incumbent, SETTINGS).matched
    # rows without a label (None) are not checked, and too few labelled rows check nothing
    few = gate.labelled_check([None] * 25 + free_candidate[:5], [None] * 25 + free_incumbent[:5], flat, incumbent, SETTINGS)
    assert not few.checked and few.matched and few.n == 5


def labelled_record(arm: str, adapter: str | None, served: float, question: str):
    record = live(arm, adapter, served)
    record.input = {"question": question}
    return record


def test_a_canary_is_judged_on_the_teams_labels_when_enough_are_there():
    # the served score prefers the canary; the team's labels say it is worse
    active = [labelled_record("active", "sql-v1", 0.5, f"q{i}") for i in range(40)]
    canary_arm = [labelled_record("canary", "sql-v2", 0.9, f"q{i}") for i in range(40, 80)]
    by_labels = {id(r): (0.3 if r.arm == "canary" else 0.8) for r in active + canary_arm}
    served = canary.judge(active + canary_arm, "sql-v2", 0.0, 30, 60, now=60.0)
    assert served.action == "promote" and served.record.basis == "live reward"
    judged = canary.judge(active + canary_arm, "sql-v2", 0.0, 30, 60, now=60.0, labelled=lambda r: by_labels[id(r)])
    assert judged.action == "rollback" and judged.record.basis == "reward by the team's labels"
    few = canary.judge(active + canary_arm, "sql-v2", 0.0, 30, 60, now=60.0,
                       labelled=lambda r: by_labels[id(r)] if r.input["question"] in {"q1", "q41"} else None)
    assert few.action == "promote" and few.record.canary_labelled == 1


def test_shadow_replays_the_teams_labelled_inputs_when_enough_are_there():
    from common.datasets import input_hash
    from trainer import shadow

    records = [labelled_record("active", "sql-v1", 0.5, f"q{i}") for i in range(40)]
    for record in records:
        record.task = "sql"
    labels = {input_hash("sql", {"question": f"q{i}"}): {"sql": "SELECT 1"} for i in range(0, 40, 3)}  # 14 labelled
    chosen, by = shadow.choose("sql", records, frozenset(), 12, labels)
    assert len(chosen) == 12 and by is labels and all(input_hash("sql", r.input) in labels for r in chosen)
    chosen, by = shadow.choose("sql", records, frozenset(), 12, dict(list(labels.items())[:5]))
    assert len(chosen) == 12 and by == {}  # too few labelled: the newest inputs, reference-free


def test_answers_given_by_a_correction_are_no_arms_and_no_shadow_inputs():
    from trainer import shadow

    corrected = [live("active", "sql-v1", 1.0) for _ in range(40)]
    for record in corrected:
        record.answered_from = "r0"
    judged = canary.judge(corrected + [live("canary", "sql-v2", 0.6) for _ in range(40)] + [live("active", "sql-v1", 0.6) for _ in range(40)],
                          "sql-v2", 0.0, 30, 60, now=60.0)
    assert judged.action == "promote" and judged.record.active_requests == 40  # the corrections' 1.0s do not count
    fresh = labelled_record("active", "sql-v1", 0.5, "new")
    assert shadow.distinct_recent(corrected + [fresh], frozenset(), 10) == [fresh]


def test_the_canary_scores_by_labels_no_round_trained_it_on(small_commerce_db):
    from common.datasets import input_hash

    def made(question: str, split: str, at: float) -> Label:
        task_input = {"question": question}
        return Label(id=question, task="sql", input=task_input, input_hash=input_hash("sql", task_input), split=split,
                     served="", served_version="base", time=at, answer={"sql": "SELECT 1"}, answer_source="correction")

    class Store:
        def labels(self, task):
            return [made("trained", "train", 10.0), made("eval", "eval", 10.0), made("fresh", "train", 100.0)]

    settings = load_settings(data_dir=small_commerce_db.parent)
    scorer = canary.labelled_scorer(settings, Store(), "sql", since=50.0)
    scored = {q: scorer(labelled_record("canary", "sql-v2", 0.5, q)) for q in ("trained", "eval", "fresh", "none")}
    assert scored["trained"] is None and scored["none"] is None
    assert scored["eval"] is not None and scored["fresh"] is not None


# --- judged as served: with the team's examples, or alone -----------------------------------------

GOOD_COPY = {"title": "Ana, seu fone te espera", "body": "Fone com 10% off hoje. Finalize sua compra agora."}
POOR_COPY = '{"title": "Oi", "body": "Compre."}'


class ExamplesStore(DictStore):
    """The store calls a gate makes: the team's push labels (16 eval rows with their reference, 6
    train examples whose answers mark a prompt that shows them) and the answer cache."""

    def __init__(self):
        from common.datasets import input_hash

        super().__init__()

        def made(i: int, split: str, answer: dict) -> Label:
            task_input = {"campaign": "carrinho_abandonado", "customer_name": f"Ana{i}", "product": "fone"}
            return Label(id=f"{split}-{i}", task="push", input=task_input, input_hash=input_hash("push", task_input), split=split,
                         served="", served_version="base", time=1.0, answer=answer, answer_source="correction")
        shown = {"title": "EXEMPLO Ana, seu fone", "body": "EXEMPLO fone com desconto"}
        self._labels = [made(i, "eval", GOOD_COPY) for i in range(16)] + [made(100 + i, "train", shown) for i in range(6)]

    def labels(self, task):
        return self._labels if task == "push" else []

    def eval_set(self, task):
        return []


class ExamplesPool(CountingPool):
    """Answers each version by whether the prompt shows the team's examples: `answers[version]` is
    (with examples, without) as good or poor copy."""

    def __init__(self, answers: dict[str | None, tuple[bool, bool]]):
        super().__init__()
        self.answers = answers

    async def complete(self, prompt, version, sampling, json_schema):
        from types import SimpleNamespace

        with_examples, alone = self.answers[version]
        good = with_examples if "EXEMPLO" in prompt else alone
        self.asked.append((version, "EXEMPLO" in prompt))
        return SimpleNamespace(text=json.dumps(GOOD_COPY, ensure_ascii=False) if good else POOR_COPY)


def gate_of(answers: dict, tmp_path, alone: frozenset[str] = frozenset(), **settings):
    store, pool = ExamplesStore(), ExamplesPool(answers)
    store.alone = alone
    settings = load_settings(data_dir=tmp_path, gate_max_rows=16, gate_min_rows=8, gate_look_rows=8, **settings)
    decision = asyncio.run(gate.run_gate(pool, settings, store, "push", "push-v2", "push-v1", round_seed=3))
    return decision, pool


def asked_of(pool, version: str) -> set[bool]:
    """Whether `version`'s prompts showed the examples: {True}, {False} or both."""
    return {shown for asked, shown in pool.asked if asked == version}


@pytest.mark.xdist_group("torch")
def test_a_version_better_alone_than_the_incumbent_as_served_is_promoted_to_be_served_alone(tmp_path):
    # with the examples the candidate answers as poorly as the incumbent; alone it answers well
    decision, pool = gate_of({"push-v2": (False, True), "push-v1": (False, False)}, tmp_path)
    assert decision.promote and decision.served_alone
    assert decision.interval == (0.0, 0.0) and decision.n == 8  # a tie with the examples: an early loss, as always
    assert decision.alone is not None and decision.alone.promote and decision.alone.interval[0] > 0
    assert decision.alone.incumbent_mean == decision.incumbent_mean  # against the incumbent as it is served, both times
    assert asked_of(pool, "push-v2") == {True, False}
    assert asked_of(pool, "push-v1") == {True, False}  # as served, and alone: its weights too must be beaten
    assert decision.reason.startswith("served without the examples: ") and "with them +0.0000" in decision.reason
    table = gate.table("push", decision, "push-v2", "push-v1")
    assert "| candidate without the examples | 8 |" in table and "promote, served alone" in table and "not chosen" in table


@pytest.mark.xdist_group("torch")
def test_the_incumbents_own_answers_alone_are_no_win_for_a_candidate_served_alone(tmp_path):
    # both answer well alone and poorly with the examples: served alone, the candidate beats the
    # incumbent as served, but its weights do not beat the incumbent's (the same weights, renamed)
    decision, pool = gate_of({"push-v2": (False, True), "push-v1": (False, True)}, tmp_path)
    assert not decision.promote and not decision.served_alone
    assert decision.alone.interval[0] > 0 and not decision.alone.promote
    assert "its weights do not win" in decision.alone.reason and "; without the examples: " in decision.reason
    assert asked_of(pool, "push-v1") == {True, False}


@pytest.mark.xdist_group("torch")
def test_a_version_that_wins_as_much_with_the_examples_is_served_with_them(tmp_path):
    decision, _ = gate_of({"push-v2": (True, True), "push-v1": (False, False)}, tmp_path)
    assert decision.promote and not decision.served_alone and decision.alone.promote
    assert decision.difference >= decision.alone.difference
    assert "wins, by less" in gate.table("push", decision, "push-v2", "push-v1")


@pytest.mark.xdist_group("torch")
def test_a_version_no_better_either_way_is_rejected_and_says_both(tmp_path):
    decision, _ = gate_of({"push-v2": (False, False), "push-v1": (True, False)}, tmp_path)
    assert not decision.promote and not decision.served_alone and not decision.alone.promote
    assert "; without the examples: " in decision.reason
    # better alone than the incumbent alone, but not than the incumbent as it is served (with the examples)
    decision, pool = gate_of({"push-v2": (False, True), "push-v1": (True, False)}, tmp_path)
    assert not decision.promote and decision.alone.interval == (0.0, 0.0) and asked_of(pool, "push-v1") == {True}


@pytest.mark.xdist_group("torch")
def test_an_incumbent_served_alone_is_judged_alone(tmp_path):
    # the incumbent's own gate chose to serve it without the examples: it answers so, poorly here
    decision, pool = gate_of({"push-v2": (True, False), "push-v1": (True, False)}, tmp_path, alone=frozenset({"push-v1"}))
    assert asked_of(pool, "push-v1") == {False}
    assert decision.promote and not decision.served_alone and decision.interval[0] > 0
    same, pool = gate_of({"push-v2": (True, False), "push-v1": (True, False)}, tmp_path)
    assert not same.promote and asked_of(pool, "push-v1") == {True}  # served with the examples, it ties


@pytest.mark.xdist_group("torch")
def test_with_serve_alone_off_or_no_examples_shown_the_candidate_is_judged_with_the_examples_alone(tmp_path):
    better_alone = {"push-v2": (False, True), "push-v1": (False, False)}
    decision, pool = gate_of(better_alone, tmp_path, serve_alone=False)
    assert not decision.promote and decision.alone is None and asked_of(pool, "push-v2") == {True}
    # push shows no examples: the prompts are bare, and a candidate better alone is better as served
    decision, pool = gate_of(better_alone, tmp_path, examples_tasks=[])
    assert decision.promote and not decision.served_alone and decision.alone is None and decision.interval[0] > 0
    assert not any(shown for _, shown in pool.asked)


@pytest.mark.xdist_group("torch")
def test_shadow_replay_asks_the_candidate_with_the_examples_serving_shows(tmp_path):
    from trainer import shadow

    store = ExamplesStore()
    served = json.dumps(GOOD_COPY, ensure_ascii=False)
    records = [make_record(id=f"p{i}", task="push", input={"campaign": "carrinho_abandonado", "customer_name": f"Bia{i}",
                                                           "product": "fone"}, raw=served) for i in range(12)]
    settings = load_settings(data_dir=tmp_path)
    assert all(gate.demonstrations(settings, store, "push", {r.id: typed_input("push", r.input) for r in records}).values())
    pool = ExamplesPool({"push-v2": (True, False)})  # as good as what was served, with the examples it is served with
    replayed = asyncio.run(shadow.replay(pool, settings, "push", "push-v2", records, 3, store=store))
    assert not replayed.worse and replayed.interval == (0.0, 0.0) and all(with_examples for _, with_examples in pool.asked)
    bare = asyncio.run(shadow.replay(ExamplesPool({"push-v2": (True, False)}), settings, "push", "push-v2", records, 3))
    assert bare.worse  # asked without them, it would be compared with answers that had them
