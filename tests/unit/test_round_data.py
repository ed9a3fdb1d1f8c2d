"""What a round trains on, followed through `trainer.data` and `trainer.methods.plan`: every
signal lands where it should (corrections and references as SFT examples and chosen answers,
ratings as KTO examples, unlabelled traffic as GRPO prompts), and an input of any eval set never
reaches a training example."""
from __future__ import annotations

import dataclasses
import json

import pytest

from common.datasets import input_hash, input_key, stored_input
from common.records import AdapterMeta, Label, RewardContext, Route
from common.rounds import GateDecision, GateRecord, Outcome, PlanStep, RoundSummary, TaskOutcome
from common.settings import load_settings
from common.tasks import SqlInput
from tests.unit.conftest import ctx
from tests.unit.test_shapes_and_routing import make_record
from trainer.data import build, no_demonstrations, served_demonstrations

# the round's modules import transformers, PEFT and TRL (about 11 s): every test here runs on the
# one worker that has them imported already (tests/unit/conftest.py)
pytestmark = pytest.mark.xdist_group("torch")

GOOD = "SELECT COUNT(*) FROM olist_customers_dataset WHERE customer_state = 'SP'"
BAD = "SELECT 1"


def label(n: int, question: str, *, answer=None, rating=None, split="train", served=BAD) -> Label:
    task_input = {"question": question}
    return Label(id=f"l{n}", task="sql", input=task_input, input_hash=input_hash("sql", task_input), split=split, served=served,
                 served_version="base", time=float(n), answer=answer, answer_source="correction" if answer else None,
                 rating=rating, updated=float(n))


def ctx_of_sql(task_input) -> RewardContext:
    """The round's reward context of a SQL input (its model), over the small DB."""
    return ctx("sql", **stored_input(task_input))


def render(messages: list[dict]) -> str:
    return json.dumps(messages, ensure_ascii=False)


def run(labels, records=(), held_out=frozenset(), limit=64):
    return build("sql", labels, list(records), render, ctx_of_sql, held_out, seed=1, unlabelled_limit=limit,
                 liked_as_supervised=True)


def test_every_signal_lands_where_it_should():
    labels = [label(0, "Quantos clientes são do estado SP?", answer={"sql": GOOD}, rating=-1),
              label(1, "Quantos pedidos existem no total?", rating=1, served="SELECT COUNT(*) FROM olist_orders_dataset"),
              label(2, "Quantos vendedores há?", rating=-1),
              label(3, "Quantos produtos há?", rating=1, served="SELECT COUNT(*) FROM olist_products_dataset"),
              label(4, "Quantos produtos há?", rating=-1, served="SELECT 7")]
    records = [(f"{n}-0", make_record(id=f"r{n}", input={"question": f"Pergunta nova {n}?"})) for n in range(3)]
    data = run(labels, records)
    assert [(e.source, e.completion) for e in data.sft] == [  # the correction, then the liked answers nobody corrected
        ("l0", GOOD), ("l1", "SELECT COUNT(*) FROM olist_orders_dataset"), ("l3", "SELECT COUNT(*) FROM olist_products_dataset")]
    assert data.summary().liked_sft == 2
    pairs = {(p.chosen, p.rejected) for p in data.pairs}
    assert (GOOD, BAD) in pairs  # the correction against what was served
    assert ("SELECT COUNT(*) FROM olist_products_dataset", "SELECT 7") in pairs  # liked against disliked, one input
    assert sorted((e.source, e.label) for e in data.kto) == [("l0", False), ("l1", True), ("l2", False), ("l3", True), ("l4", False)]
    unlabelled = [p for p in data.prompts if not p.reference]
    assert [p.source for p in unlabelled][-3:] == ["r2", "r1", "r0"]  # the newest first
    assert json.loads(next(p for p in data.prompts if p.source == "l0").reference) == {"sql": GOOD}
    assert data.entry_ids == ["0-0", "1-0", "2-0"]  # every record read is acknowledged with the round


def test_the_rows_a_round_trains_on_never_include_eval_inputs():
    team_eval = label(0, "Quantos pedidos em 2016?", answer={"sql": GOOD}, split="eval", rating=-1)
    bootstrap_eval = {"question": "Quantos pedidos em 2017?"}
    train = [label(n, f"Quantos clientes em {uf}?", answer={"sql": GOOD}, rating=1) for n, uf in enumerate(("SP", "RJ", "MG"), 1)]
    records = [("9-0", make_record(id="r9", input=bootstrap_eval)), ("10-0", make_record(id="r10", input=team_eval.input))]
    data = run([team_eval, *train, label(7, bootstrap_eval["question"], answer={"sql": GOOD})], records,
               held_out=frozenset({input_key(bootstrap_eval)}))
    trained = json.dumps([dataclasses.asdict(e) for e in (*data.sft, *data.validation, *data.pairs, *data.kto, *data.prompts)], ensure_ascii=False)
    assert "2016" not in trained and "2017" not in trained
    for uf in ("SP", "RJ", "MG"):
        assert f"Quantos clientes em {uf}?" in trained
    assert data.skipped["eval-set input"] == 2 and data.skipped["eval-set or labelled input"] == 2


def test_labels_are_replayed_every_round():
    """A label is never consumed: a later round's data holds it beside the new ones."""
    first = [label(n, f"Quantos clientes em {uf}?", answer={"sql": GOOD}) for n, uf in enumerate(("SP", "RJ"))]
    later = first + [label(5, "Quantos clientes em BA?", answer={"sql": GOOD})]
    assert {e.source for e in run(first).sft} <= {e.source for e in run(later).sft} == {"l0", "l1", "l5"}


def test_liked_answers_join_sft_only_beside_corrections_and_never_the_validation_slice():
    rated_only = [label(n, f"Quantos pedidos no dia {n}?", rating=1, served=GOOD) for n in range(3)]
    assert run(rated_only).sft == []  # ratings alone: KTO's data, not SFT's
    corrected = [label(n, f"Quantos clientes no dia {n}?", answer={"sql": GOOD}) for n in range(10, 40)]
    data = run(corrected + rated_only)
    assert {e.source for e in data.sft if e.liked} == {"l0", "l1", "l2"}
    assert not any(e.liked for e in data.validation) and len(data.validation) == 4
    without = build("sql", corrected + rated_only, [], render, ctx_of_sql, frozenset(), seed=1, unlabelled_limit=64,
                    liked_as_supervised=False)
    assert not any(e.liked for e in without.sft) and len(without.sft) == 26


def test_a_newer_correction_of_an_input_replaces_an_older_one():
    older = label(0, "Quantos clientes em SP?", answer={"sql": BAD.replace("1", "2")})
    newer = label(1, "Quantos clientes em SP?", answer={"sql": GOOD})
    assert [e.completion for e in run([older, newer]).sft] == [GOOD]


def test_sft_keeps_a_validation_slice_apart():
    labels = [label(n, f"Quantos pedidos no dia {n}?", answer={"sql": GOOD}) for n in range(40)]
    data = run(labels)
    assert len(data.validation) == 6 and len(data.sft) == 34
    assert not {e.source for e in data.validation} & {e.source for e in data.sft}


def test_auto_plans_methods_from_what_the_data_holds():
    from trainer import methods

    settings = load_settings(min_sft_examples=2, min_dpo_pairs=2, min_kto_examples=2)
    corrected = run([label(n, f"Quantos clientes em {uf}?", answer={"sql": GOOD}) for n, uf in enumerate(("SP", "RJ", "MG"))])
    assert [m for m, _ in methods.plan("auto", corrected, settings)] == ["sft"]  # DPO after SFT measured worse
    both = load_settings(min_sft_examples=2, min_dpo_pairs=2, min_kto_examples=2, preference_after_supervised=True)
    assert [m for m, _ in methods.plan("auto", corrected, both)] == ["sft", "dpo"]
    rated = run([label(n, f"Quantos clientes em {uf}?", rating=1 if n % 2 else -1, served=GOOD if n % 2 else BAD)
                 for n, uf in enumerate(("SP", "RJ", "MG", "BA"))])
    steps = methods.plan("auto", rated, settings)
    assert [m for m, _ in steps] == ["kto"] and "too few pairs" in steps[0][1]
    traffic = run([], [(f"{n}-0", make_record(id=f"r{n}", input={"question": f"q{n}"})) for n in range(3)])
    assert [m for m, _ in methods.plan("auto", traffic, settings)] == ["grpo"]
    assert methods.plan("auto", run([]), settings) == []
    assert [m for m, _ in methods.plan("sft", corrected, settings)] == ["sft"] and methods.plan("kto", corrected, settings) == []


def round_with(task: str, method: str, interval: tuple[float, float], methods_run: int = 1) -> RoundSummary:
    """A saved round in which `task`'s candidate, trained by `method` (alone, or beside GRPO), met the gate at `interval`."""
    decision = GateDecision(promote=False, reason="worse", n=40, rows={"bootstrap": 40}, candidate_mean=0.1, incumbent_mean=0.3,
                            difference=sum(interval) / 2, interval=interval)
    plan = [PlanStep(method=method, why="test")] + [PlanStep(method="grpo", why="test")] * (methods_run - 1)
    return RoundSummary(round="r", started=0.0, tasks={task: TaskOutcome(outcome=Outcome.REJECTED, why="test", plan=plan,
                                                                         gate=GateRecord(decision=decision, incumbent="base"))})


def test_auto_leaves_out_a_method_whose_latest_candidates_were_far_worse_and_says_why():
    from trainer import methods

    settings = load_settings(min_sft_examples=2, min_dpo_pairs=2, min_kto_examples=2)
    far, near = (-0.35, -0.28), (-0.06, 0.01)
    history = [round_with("sql", "kto", far), round_with("push", "kto", near), round_with("sql", "kto", far)]  # newest first
    left_out = methods.far_worse(history, "sql", settings)
    assert list(left_out) == ["kto"] and "-0.315" in left_out["kto"] and "last 2 candidates" in left_out["kto"]
    assert methods.far_worse(history, "push", settings) == {}  # one candidate, and not far worse
    # one far worse and one within the margin: kept; a candidate of two methods is no method's alone; 0 turns it off
    assert methods.far_worse([round_with("sql", "kto", far), round_with("sql", "kto", near)], "sql", settings) == {}
    assert methods.far_worse([round_with("sql", "kto", far, 2), round_with("sql", "kto", far)], "sql", settings) == {}
    assert methods.far_worse(history, "sql", load_settings(auto_far_worse_tries=0)) == {}
    rated = run([label(n, f"Quantos clientes em {uf}?", rating=1 if n % 2 else -1, served=GOOD if n % 2 else BAD)
                 for n, uf in enumerate(("SP", "RJ", "MG", "BA"))],
                [(f"{n}-0", make_record(id=f"r{n}", input={"question": f"q{n}"})) for n in range(3)])
    assert [m for m, _ in methods.plan("auto", rated, settings)] == ["kto"]
    steps = methods.plan("auto", rated, settings, left_out)
    assert [m for m, _ in steps] == ["grpo"] and steps[0][1].startswith("kto left out: its last 2 candidates")
    assert [m for m, _ in methods.plan("kto", rated, settings, left_out)] == ["kto"]  # named by the setting, it runs
    assert methods.plan("auto", rated, settings, {**left_out, "grpo": "far worse too"}) == []  # nothing else to run


def test_a_candidate_continues_the_active_version_it_can_and_starts_fresh_otherwise():
    from trainer import methods

    settings = load_settings()
    assert settings.train_from == "auto"
    model = settings.base_model_path
    active = AdapterMeta(version="sql-v3", task="sql", path="/adapters/sql-v3", base_model=model)
    assert methods.start(settings, None, model) == ("base", "no active version: a fresh LoRA on the base model", None)
    where, why, parent = methods.start(settings, active, model)
    assert where == "active" and "sql-v3" in why and parent is active  # the version the trainer loads
    where, why, parent = methods.start(settings, active, "/another/model")
    assert where == "base" and "another base model" in why and parent is None
    assert methods.start(load_settings(train_from="base"), active, model) == ("base", "TUCANO_TRAIN_FROM=base", None)


def rejected_candidate(version: str, parent: str | None, path, difference: float = 0.01, incumbent: str = "base", method: str = "grpo",
              created: float = 0.0, promote: bool = False, worse: bool = False) -> AdapterMeta:
    from common.rounds import ComponentDifference

    decision = GateDecision(promote=promote, reason="", n=32, rows={"bootstrap": 32}, candidate_mean=0.5 + difference,
                            incumbent_mean=0.5, difference=difference, interval=(difference - 0.04, difference + 0.04),
                            components={"price": ComponentDifference(-0.2 if worse else 0.0, (-0.3, -0.1) if worse else (-0.1, 0.1), worse)})
    return AdapterMeta(version=version, task="extraction", path=str(path), status="rejected", parent=parent, method=method,
                       base_model="/model", created=created, gate=GateRecord(decision=decision, incumbent=incumbent))


def test_a_grpo_round_continues_the_newest_rejected_candidate_not_found_worse_up_to_the_limit(tmp_path):
    from trainer import methods

    settings = load_settings()
    assert settings.grpo_continue_rejected == 2
    active = AdapterMeta(version="extraction-v1", task="extraction", path=str(tmp_path), status="active", base_model="/model",
                         created=1.0)
    v2 = rejected_candidate("extraction-v2", "extraction-v1", tmp_path, incumbent="extraction-v1", created=2.0)
    chosen, why = methods.continued(settings, active, "/model", [active, v2], ["grpo"])
    assert chosen is v2 and "continues extraction-v2" in why and "+0.0100" in why and "1 of at most 2" in why
    v3 = rejected_candidate("extraction-v3", "extraction-v2", tmp_path, incumbent="extraction-v1", created=3.0)
    chosen, why = methods.continued(settings, active, "/model", [active, v2, v3], ["grpo"])
    assert chosen is v3 and "2 of at most 2" in why
    v4 = rejected_candidate("extraction-v4", "extraction-v3", tmp_path, incumbent="extraction-v1", created=4.0)
    chosen, why = methods.continued(settings, active, "/model", [active, v2, v3, v4], ["grpo"])
    assert chosen is None and "more than 2 rejected" in why  # the line is dropped for the active version again
    # from the base model, when no version is active
    fresh = rejected_candidate("extraction-v1", None, tmp_path, created=1.0)
    assert methods.continued(settings, None, "/model", [fresh], ["grpo"])[0] is fresh


@pytest.mark.parametrize("case, expected", [
    ("worse", "found it worse (-0.0010"),
    ("component worse", "price significantly"),
    ("passed the gate", "not a GRPO candidate rejected by its gate"),
    ("trained with sft", "not a GRPO candidate rejected by its gate"),
    ("judged against another version", "not a GRPO candidate rejected by its gate against extraction-v1"),
    ("another line", "does not descend from extraction-v1"),
    ("another base model", "another base model (/model)"),
    ("files gone", "files are gone"),
    ("newest is active", "the newest version extraction-v1 is active"),
    ("plan with sft", "the plan is sft+grpo, not GRPO alone"),
    ("off", "off"),
])
def test_a_round_continues_the_active_version_when_the_newest_candidate_may_not_be_continued(tmp_path, case, expected):
    from trainer import methods

    active = AdapterMeta(version="extraction-v1", task="extraction", path=str(tmp_path), status="active", base_model="/model",
                         created=1.0 if case != "newest is active" else 9.0)
    changes = {"worse": dict(difference=-0.001), "component worse": dict(worse=True), "passed the gate": dict(promote=True),
               "trained with sft": dict(method="sft"), "judged against another version": dict(incumbent="extraction-v0"),
               "another line": dict(parent="extraction-v0"), "files gone": dict(path=tmp_path / "gone")}.get(case, {})
    arguments = dict(version="extraction-v2", parent="extraction-v1", path=tmp_path, incumbent="extraction-v1", created=2.0) | changes
    candidate = rejected_candidate(**arguments)
    model = "/another/model" if case == "another base model" else "/model"
    settings = load_settings(grpo_continue_rejected=0) if case == "off" else load_settings()
    plan = ["sft", "grpo"] if case == "plan with sft" else ["grpo"]
    chosen, why = methods.continued(settings, active, model, [active, candidate], plan)
    assert chosen is None and expected in why, why


class NoLabels:
    """A store with nothing in it yet: no labels, no eval rows, no route, no adapters, no rounds."""

    def labels(self, task):
        return []

    def rounds(self, count=50):
        return []

    def last_trained(self, task):
        return 0.0

    def eval_set(self, task):
        return []

    def route(self, task):
        return Route()

    def adapters(self, *tasks):
        return []

    def recent_records(self, task, count, scan=5000, keep=None):
        return []


def test_a_round_builds_each_tasks_data_with_its_own_training_settings(monkeypatch):
    """`task_training`'s sft_from_liked decides, per task, whether liked answers join its SFT; the
    prompts carry the examples serving shows."""
    from trainer import round as round_module

    built: dict[str, bool] = {}

    class Template:
        render = staticmethod(render)

    class Built(Exception):
        pass

    def capture(task, labels, records, render, reward_context, held_out, seed, limit, liked_as_supervised, shown, lineage, groups_limit, earlier):
        built[task] = (liked_as_supervised, shown is not no_demonstrations)
        raise Built

    monkeypatch.setattr(round_module.ChatTemplate, "load", staticmethod(lambda path: Template()))
    monkeypatch.setattr(round_module.round_data, "build", capture)
    settings = load_settings(task_training={"push": {"sft_from_liked": False}})
    for task in ("push", "sql", "insights"):
        with pytest.raises(Built):
            round_module._train_task(settings, NoLabels(), None, task, [], "r1", print, None)
    assert built == {"push": (False, False), "sql": (True, False), "insights": (True, False)}  # bare prompts by default
    # with train_with_examples, each task's prompts show the team's examples where serving's do (insights' never)
    for task in ("push", "sql", "insights"):
        with pytest.raises(Built):
            round_module._train_task(settings.model_copy(update={"train_with_examples": True}), NoLabels(), None, task, [], "r1", print, None)
    assert built == {"push": (False, True), "sql": (True, True), "insights": (True, False)}


def test_a_task_with_nothing_new_reads_no_earlier_groups(monkeypatch):
    """The earlier groups are read from the records stream only for a task that trains this round:
    one with no new records and no changed label is not trained, and costs no scan."""
    from common.rounds import Outcome
    from trainer import round as round_module

    class Template:
        render = staticmethod(render)

    class NoScan(NoLabels):
        def recent_records(self, task, count, scan=5000, keep=None):
            raise AssertionError("scanned the records stream for a task that does not train")

    monkeypatch.setattr(round_module.ChatTemplate, "load", staticmethod(lambda path: Template()))
    entry = round_module._train_task(load_settings(), NoScan(), None, "push", [], "r1", print, None)
    assert entry.outcome == Outcome.NOT_TRAINED and entry.reason.startswith("nothing new")


def test_each_training_prompt_shows_what_serving_would_and_never_its_own_label():
    """A version learns from the prompts it will be served with: each input's most similar train
    examples as earlier turns, never the input's own label, never an eval label."""
    corrected = [label(n, f"Quantos clientes em {uf}?", answer={"sql": GOOD.replace("'SP'", f"'{uf}'")})
                 for n, uf in enumerate(("SP", "RJ", "MG", "BA", "PR"))]
    secret = label(9, "Quantos clientes em AM?", answer={"sql": "SELECT 'eval only'"}, split="eval")
    unrelated = label(8, "Qual a nota média das avaliações?", answer={"sql": "SELECT AVG(review_score) FROM olist_order_reviews_dataset"})
    labels = [*corrected, unrelated, secret]
    settings = load_settings(examples_k=2, examples_tasks=["sql"], train_with_examples=True)
    shown = served_demonstrations(settings, "sql", labels)
    data = build("sql", labels, [("1-0", make_record(id="r1", input={"question": "Quantos clientes em SC?"}))], render,
                 ctx_of_sql, frozenset(), seed=1, unlabelled_limit=64, liked_as_supervised=True, shown=shown)
    for example in data.sft + data.validation + data.prompts:
        turns = json.loads(example.prompt)
        if example.source == "l8":  # no word in common with any other input: no demonstration, as serving
            assert len(turns) == 2
            continue
        own = turns[-1]["content"]
        earlier = [t["content"] for t in turns[1:-1]]
        assert len(earlier) == 4, turns  # two demonstrations: a question and its answer each
        assert own not in earlier[::2] and "eval only" not in example.prompt
        assert all("Quantos clientes em" in question for question in earlier[::2])  # the most similar, not the unrelated one
        for question, answer in zip(earlier[::2], earlier[1::2]):  # each shown question with its own corrected answer
            assert answer == GOOD.replace("'SP'", f"'{question.removesuffix('?').split()[-1]}'")
    assert served_demonstrations(load_settings(examples_tasks=["push"], train_with_examples=True), "sql", labels) is no_demonstrations
    assert served_demonstrations(load_settings(examples_tasks=["sql"]), "sql", labels) is no_demonstrations  # off by default
    plain = build("sql", labels, [], render, ctx_of_sql, frozenset(), seed=1, unlabelled_limit=64, liked_as_supervised=True)
    assert all(len(json.loads(e.prompt)) == 2 for e in plain.sft + plain.prompts)  # by default, no demonstrations


def grouped(n: int, question: str, texts: list[str], *, adapter=None, valid=True, whole=True, temperature=0.7, cut=0):
    """A served record of `texts` sampled as one group (the first answered); `cut`: samples the
    request cut before they finished, answered from the first `len(texts)` to finish."""
    from common.records import Group, Reward, Sample, Sampling

    samples = [Sample(text=t, token_ids=[10 + i, 2], logprobs=[-0.5, -0.1] if whole or i else [-0.5], finish_reason="stop",
                      valid=valid, reward=Reward(0.5, {}, False)) for i, t in enumerate(texts)]
    sampling = Sampling(temperature, 1.0, 256, None, 0.0, len(texts) + cut, len(texts) if cut else 0)
    return (f"{n}-0", make_record(id=f"r{n}", input={"question": question}, raw=texts[0], adapter=adapter,
                                  arm="active" if adapter else "base", sampling=sampling,
                                  group=Group(prompt_token_ids=[1, 2, 3], samples=samples, chosen=0, cut=cut)))


def test_served_groups_become_rollouts_of_the_lineage_and_every_one_without_signal_is_counted():
    from trainer.data import lineage

    corrected = label(9, "Quantos clientes de SP?", answer={"sql": GOOD})
    corrected = Label(**{**{f: getattr(corrected, f) for f in corrected.__struct_fields__}, "id": "r1"})  # the record's own label
    records = [grouped(0, "Quantos pedidos?", [GOOD, BAD, BAD, GOOD]),
               grouped(1, "Quantos clientes de SP?", [BAD, GOOD, BAD, BAD]),  # corrected afterwards: scored with it
               grouped(2, "Quantos vendedores?", [GOOD, BAD], adapter="sql-v2"),  # served by the active version
               grouped(3, "Quantos produtos?", [GOOD, BAD], adapter="sql-v9"),  # a version of another line
               grouped(4, "Quantos itens?", [BAD, BAD, BAD]),
               grouped(5, "Quantas lojas?", [GOOD, BAD], valid=False),
               grouped(6, "Quantos fretes?", [GOOD, BAD], whole=False),
               grouped(7, "Quantos pedidos em 2016?", [GOOD, BAD]),
               (f"{8}-0", make_record(id="r8", input={"question": "Sem grupo?"})),  # a record before groups
               grouped(10, "Quantos cupons?", [GOOD, BAD], cut=2)]  # the first 2 of 4 to finish: the 2 shortest
    v1 = AdapterMeta(version="sql-v1", task="sql", path="/a/1")
    v2 = AdapterMeta(version="sql-v2", task="sql", path="/a/2", parent="sql-v1")
    versions = lineage(v2, {"sql-v1": v1, "sql-v2": v2})
    assert versions == ("sql-v2", "sql-v1", "base")
    held = frozenset({input_key({"question": "Quantos pedidos em 2016?"})})
    data = build("sql", [corrected], records, render, ctx_of_sql, held, seed=1, unlabelled_limit=64,
                 liked_as_supervised=True, lineage=versions, groups_limit=10)
    assert data.policy == "sql-v2"
    assert [g.source for g in data.groups] == ["r2", "r1", "r0"]  # the newest first
    assert [g.version for g in data.groups] == ["sql-v2", "base", "base"]
    by_source = {g.source: g for g in data.groups}
    assert json.loads(by_source["r1"].reference) == {"sql": GOOD} and by_source["r0"].reference == ""
    assert by_source["r0"].completion_ids == [[10, 2], [11, 2], [12, 2], [13, 2]] and by_source["r0"].prompt_token_ids == [1, 2, 3]
    assert by_source["r0"].temperature == 0.7 and RewardContext.from_json(by_source["r0"].context, SqlInput).input.question == "Quantos pedidos?"
    assert data.skipped == {"group of a version outside the lineage": 1, "group of identical completions": 1,
                            "group of invalid completions only": 1, "group not whole": 1, "group of an eval-set input": 1,
                            "group cut before every sample finished": 1, "eval-set or labelled input": 2}
    assert "Pergunta: Quantos cupons?" in {json.loads(p.prompt)[-1]["content"] for p in data.prompts}  # its input is still a prompt
    summary = data.summary()
    assert summary.groups == 3 and summary.labelled_groups == 1 and summary.sources.groups == ["r0", "r1", "r2"]
    assert [m for m, _ in methods_plan(data)] == ["grpo"] and "3 served groups (1 scored with a label)" in methods_plan(data)[0][1]
    fresh = build("sql", [], records, render, ctx_of_sql, held, seed=1, unlabelled_limit=64, liked_as_supervised=True,
                  lineage=lineage(None, {}), groups_limit=1)
    assert [g.source for g in fresh.groups] == ["r1"] and fresh.skipped["group beyond the round's limit"] == 1
    assert fresh.skipped["group of a version outside the lineage"] == 2  # a fresh LoRA is the base model's policy


def test_groups_the_policy_served_in_earlier_rounds_are_trained_after_the_rounds_own_and_counted_apart():
    """A round whose candidate was rejected loses no groups: the next round, training from the same
    policy, reads them again after its own new ones, within the same limit. Only the policy's own
    groups come back (a parent's were trained into it already), and each is checked as a new one is."""
    from trainer.data import lineage

    new = [grouped(20, "Quantos pedidos?", [GOOD, BAD]), grouped(21, "Quantos clientes?", [BAD, GOOD], adapter="sql-v2")]
    earlier = [record for _, record in [grouped(12, "Quantos vendedores?", [GOOD, BAD], adapter="sql-v2"),
                                        grouped(11, "Quantos itens?", [BAD, BAD], adapter="sql-v2"),
                                        grouped(10, "Quantos produtos?", [GOOD, BAD], adapter="sql-v2"),
                                        grouped(9, "Quantos fretes?", [GOOD, BAD], adapter="sql-v1")]]  # newest first
    v1 = AdapterMeta(version="sql-v1", task="sql", path="/a/1")
    v2 = AdapterMeta(version="sql-v2", task="sql", path="/a/2", parent="sql-v1")
    versions = lineage(v2, {"sql-v1": v1, "sql-v2": v2})
    data = build("sql", [], new, render, ctx_of_sql, frozenset(), seed=1, unlabelled_limit=64, liked_as_supervised=True,
                 lineage=versions, groups_limit=10, earlier=earlier)
    assert [g.source for g in data.groups] == ["r21", "r20", "r12", "r10"]  # the round's own first, then the newest earlier
    assert data.earlier_groups == 2 and data.summary().earlier_groups == 2 and data.summary().groups == 4
    assert data.skipped == {"earlier group of identical completions": 1, "earlier group of a version outside the lineage": 1}
    assert {p.source for p in data.prompts} == {"r20", "r21"}  # earlier records are not this round's prompts
    assert "GRPO on 4 served groups (0 scored with a label, 2 served before this round)" in methods_plan(data)[0][1]
    limited = build("sql", [], new, render, ctx_of_sql, frozenset(), seed=1, unlabelled_limit=64, liked_as_supervised=True,
                    lineage=versions, groups_limit=3, earlier=earlier)
    assert [g.source for g in limited.groups] == ["r21", "r20", "r12"] and limited.earlier_groups == 1
    assert limited.skipped["earlier group beyond the round's limit"] == 1
    alone = build("sql", [], new, render, ctx_of_sql, frozenset(), seed=1, unlabelled_limit=64, liked_as_supervised=True,
                  lineage=versions, groups_limit=10)
    assert [g.source for g in alone.groups] == ["r21", "r20"] and alone.earlier_groups == 0


def methods_plan(data):
    from trainer import methods

    return methods.plan("auto", data, load_settings(min_sft_examples=1000))


def test_a_stored_input_the_task_no_longer_accepts_is_skipped_and_counted_never_trained():
    """Records and labels keep their inputs as stored; a round reads each back as the task's input model.
    One that is no longer a valid input (stored under an older model) is left out and counted."""
    labels = [label(0, "", answer={"sql": GOOD}), label(1, "Quantos pedidos existem?", answer={"sql": GOOD})]
    records = [("0-0", make_record(id="r0", input={"pergunta": "Quantos?"})), ("1-0", make_record(id="r1", input={"question": "Quantos?"}))]
    data = run(labels, records)
    assert [e.source for e in data.sft] == ["l1"]
    assert sorted(p.source for p in data.prompts) == ["l1", "r1"]
    assert data.skipped["stored input not valid for the task"] == 2


def test_the_reward_context_goes_to_json_and_back_with_the_tasks_input_model():
    from tasks import definition

    context = ctx("sql", question="Quantos pedidos?")
    back = RewardContext.from_json(context.to_json(), definition("sql").input_model)
    assert back == context and isinstance(back.input, SqlInput)
    assert RewardContext.from_json("", SqlInput) == RewardContext()  # a context without an input
    with pytest.raises(ValueError, match="question"):
        RewardContext.from_json('{"input": {"pergunta": "x"}}', SqlInput)


def test_a_method_config_built_and_never_trained_leaves_no_directory_behind():
    """Each method's TRL config names its output dir; only training makes it (and `methods.run`
    removes it after), so planning or building a config and stopping there leaves nothing in /tmp."""
    from pathlib import Path

    from trainer import methods

    args = methods.trainer_args(load_settings(), 1.0, 4, 8)
    again = methods.trainer_args(load_settings(), 1.0, 4, 8)
    assert args["output_dir"] != again["output_dir"]
    assert not Path(args["output_dir"]).exists() and not Path(again["output_dir"]).exists()


def test_auto_does_not_choose_grpo_for_extractions_traffic_and_says_why():
    from tasks.registry import training_settings
    from trainer import methods

    general = load_settings(min_sft_examples=2, min_dpo_pairs=2, min_kto_examples=2)
    traffic = run([], [(f"{n}-0", make_record(id=f"r{n}", input={"question": f"q{n}"})) for n in range(3)])
    extraction, sql = training_settings(general, "extraction"), training_settings(general, "sql")
    left_out = methods.left_out([], "extraction", extraction)
    assert list(left_out) == ["grpo"] and "auto_grpo is off" in left_out["grpo"]
    assert methods.plan("auto", traffic, extraction, left_out) == []
    assert methods.left_out([], "sql", sql) == {} and [m for m, _ in methods.plan("auto", traffic, sql, {})] == ["grpo"]
    # labels still train extraction; a method named by the setting runs whatever auto would leave out
    corrected = run([label(n, f"Quantos clientes em {uf}?", answer={"sql": GOOD}) for n, uf in enumerate(("SP", "RJ", "MG"))])
    assert [m for m, _ in methods.plan("auto", corrected, extraction, left_out)] == ["sft"]
    assert [m for m, _ in methods.plan("grpo", traffic, extraction, {})] == ["grpo"]
    # the team turns it back on, and a far worse method is named once with its own reason
    on = training_settings(load_settings(task_training={"extraction": {"auto_grpo": True}}), "extraction")
    assert methods.left_out([], "extraction", on) == {}
    far = round_with("extraction", "grpo", (-0.35, -0.28))
    assert "far worse" in methods.left_out([far, far], "extraction", extraction)["grpo"]
