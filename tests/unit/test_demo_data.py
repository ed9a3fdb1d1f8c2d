"""The demo's data keeps the measurements honest: the rows the gate and the benchmarks measure on
(the eval and test splits, the demo store's own) are never what the demo model's bootstrap reads
(its fine-tuning, or for the tiny models their tokenizer and language-model corpus), and the
bootstrap's rows are general ones: none of the store's catalogue, complaint categories, SQL
questions, campaigns or insights questions."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import tasks
from common.datasets import SPLITS, input_key, load_split
from common.records import RewardContext
from common.settings import load_settings
from common.tasks import ExtractionInput
from demo import bootstrap, commerce_db, datasets
from demo.reviews import TEAM_ONLY_SCENARIOS, TEAM_PRODUCTS
from demo.sql_patterns import JOIN_PATTERNS, TEAM_PATTERNS
from router import prompts
from tasks import TASKS, definition, registry

MEASURED = ("eval", "test", "holdout")
# one worker builds the datasets once for the whole module; `bootstrap.run` imports torch (tests/unit/conftest.py)
pytestmark = pytest.mark.xdist_group("torch")


@pytest.fixture(scope="module")
def built_datasets(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo-data")
    labelled = commerce_db.generate(root / "commerce.db", 1500, seed=5)
    (root / "labels.json").write_text(json.dumps(labelled, ensure_ascii=False))
    datasets.build(root / "commerce.db", labelled, root / "datasets", seed=5)
    return root


def test_no_input_is_in_two_splits(built_datasets):
    for task in TASKS:
        keys = {split: {input_key(r["input"]) for r in load_split(built_datasets / "datasets", task, split)} for split in SPLITS}
        for split in MEASURED:
            assert keys[split], f"{task} has no {split} rows"
            for other in SPLITS:
                if other != split:
                    assert not keys[split] & keys[other], f"{task}: {split} inputs also in {other}"


def test_the_bootstrap_split_holds_general_rows_only(built_datasets):
    read = lambda task, split: load_split(built_datasets / "datasets", task, split)
    team_products = {p for p, _ in TEAM_PRODUCTS}
    for row in read("extraction", "bootstrap"):
        assert row["reference"]["product_mentioned"] not in team_products
        assert row["reference"]["complaint_category"] not in TEAM_ONLY_SCENARIOS
    assert any(r["reference"]["complaint_category"] in TEAM_ONLY_SCENARIOS for r in read("extraction", "train"))
    assert not {r["pattern"] for r in read("sql", "bootstrap")} & TEAM_PATTERNS
    assert {r["pattern"] for s in ("eval", "test") for r in read("sql", s)} <= TEAM_PATTERNS
    assert not {r["pattern"] for r in read("sql", "holdout")} & TEAM_PATTERNS
    assert not {r["input"]["campaign"] for r in read("push", "bootstrap")} & set(datasets.TEAM_CAMPAIGNS)
    assert {r["input"]["campaign"] for s in ("eval", "test") for r in read("push", s)} <= set(datasets.TEAM_CAMPAIGNS)
    assert not {r["input"]["campaign"] for r in read("push", "holdout")} & set(datasets.TEAM_CAMPAIGNS)
    questions = lambda split: {r["input"]["question"].split(" (dados")[0] for r in read("insights", split)}
    assert not questions("bootstrap") & (questions("test") | questions("eval"))


def test_the_sql_bootstrap_reads_joins_with_parameters_and_no_other_row_moves(built_datasets, tmp_path, monkeypatch):
    """SQL's bootstrap split reads many rows of each general join (`JOIN_PATTERNS`), drawn from their
    own random stream: without them every other split of every task holds the same rows."""
    rows = load_split(built_datasets / "datasets", "sql", "bootstrap")
    by_pattern = {pid: [r for r in rows if r["pattern"] == pid] for pid, *_ in JOIN_PATTERNS}
    assert all(len(found) >= 3 for found in by_pattern.values()), {pid: len(found) for pid, found in by_pattern.items()}
    assert sum(" JOIN " in r["reference"]["sql"] for r in rows) >= len(rows) / 3
    assert not set(by_pattern) & TEAM_PATTERNS

    monkeypatch.setattr(datasets, "JOIN_PATTERNS", ())
    datasets.build(built_datasets / "commerce.db", json.loads((built_datasets / "labels.json").read_text()), tmp_path, seed=5)
    for task in TASKS:
        for split in SPLITS:
            without = load_split(tmp_path, task, split)
            if (task, split) == ("sql", "bootstrap"):
                assert without == [r for r in rows if r["pattern"] not in by_pattern]
            else:
                assert without == load_split(built_datasets / "datasets", task, split), (task, split)


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_the_model_steps_read_the_bootstrap_split_alone(built_datasets, tmp_path, monkeypatch, model):
    """`bootstrap.run` with its model builders recording what they are given: every row, corpus
    text and example comes from the bootstrap split, and no eval or test input is among them."""
    root = tmp_path / "data"
    root.mkdir()
    for name in ("commerce.db", "datasets"):
        (root / name).symlink_to(built_datasets / name)
    settings = load_settings(data_dir=root, bootstrap_model=model, bootstrap_orders=1500, seed=5)
    manifest = {"model": model, "seed": 5, "steps": {
        "commerce_db": {"fingerprint": bootstrap._fingerprint(bootstrap.DB_VERSION, 5, 1500), "sha256": commerce_db.file_sha256(root / "commerce.db")}}}
    manifest["steps"]["datasets"] = {"fingerprint": bootstrap._fingerprint(bootstrap.DATASETS_VERSION, 5, manifest["steps"]["commerce_db"]["sha256"])}
    settings.manifest_path.write_text(json.dumps(manifest))
    (root / "review_labels.jsonl").write_text("")
    seen: list[str] = []

    def tiny(out_dir, rows, corpus, think, *args, **kwargs):
        seen.extend(input_key(r["input"]) for r in rows)
        seen.extend(corpus)
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        return {}

    def tuned(model_dir, out_dir, rows, *args, **kwargs):
        seen.extend(input_key(r["input"]) for task_rows in rows.values() for r in task_rows)
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        return {}

    def converted(gguf, out_dir):
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        return {"parameters": 1}

    monkeypatch.setattr(bootstrap, "build_tiny_model", tiny)
    monkeypatch.setattr(bootstrap, "finetune", tuned)
    monkeypatch.setattr(bootstrap.pretrained, "gguf_file", lambda source, work_dir: Path("/nonexistent.gguf"))
    monkeypatch.setattr(bootstrap.pretrained, "convert", converted)
    monkeypatch.setattr(bootstrap, "tokenizer_eos", lambda *args: None)
    copies = []

    def with_template(base, out_dir, template):
        copies.append((base.name, out_dir.name, template))
        out_dir.mkdir()
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(bootstrap, "with_template", with_template)
    if model == "smollm2":  # what `tucano serve` builds first: the pretrained weights under the served paths, no training
        bootstrap.run(settings, serveable_only=True)
        assert bootstrap.is_serveable(settings) and not bootstrap.is_built(settings) and not seen
        templates = bootstrap.TEMPLATES[bootstrap.pretrained.SOURCES[model].chat]
        assert copies == [("pretrained-" + bootstrap.pretrained.SOURCES[model].name, "early_base.partial", templates["base"]),
                          ("pretrained-" + bootstrap.pretrained.SOURCES[model].name, "early_think.partial", templates["think"])]
        assert "early_models" in bootstrap.read_manifest(settings)["steps"]
        bootstrap.run(settings, serveable_only=True)  # nothing to do again
        assert len(copies) == 2
    bootstrap.run(settings)
    assert bootstrap.is_built(settings) and bootstrap.is_serveable(settings)
    assert "early_models" not in bootstrap.read_manifest(settings)["steps"]  # models/base is the fine-tuned model now
    bootstrap.run(settings, serveable_only=True)  # a built bootstrap has nothing early to build
    assert bootstrap.is_built(settings)
    assert seen
    general = {input_key(r["input"]) for t in TASKS for r in load_split(root / "datasets", t, "bootstrap")}
    measured = {input_key(r["input"]) for t in TASKS for s in MEASURED for r in load_split(root / "datasets", t, s)}
    keys = [k for k in seen if k.startswith("{")]
    assert keys and set(keys) <= general
    assert not set(keys) & measured
    texts = {t for t in seen if not t.startswith("{")}
    for task in TASKS:  # no measured row's text (its prompt and answer) is in the tiny models' corpus either
        for split in MEASURED:
            for row in load_split(root / "datasets", task, split):
                assert bootstrap._corpus([row])[0] not in texts, (task, split, row["id"])


def test_a_new_system_prompt_makes_the_demo_models_stale(built_datasets, monkeypatch):
    """The models learn the prompts' wording: a change to one rebuilds them, not only a change to
    the rows."""
    settings = load_settings(data_dir=built_datasets, seed=5)
    before = bootstrap._training_fingerprint(settings)
    assert bootstrap._training_fingerprint(settings) == before
    entry = definition("extraction")
    monkeypatch.setitem(registry._ENTRIES, "extraction", replace(entry, system_prompt=entry.system_prompt.replace("key_phrases", "trechos")))
    assert bootstrap._training_fingerprint(settings) != before


def test_a_new_user_message_template_makes_the_demo_models_stale(built_datasets, monkeypatch):
    """The user message's wording (the template around a row's input) is part of what the models
    learn, as the system prompt is."""
    settings = load_settings(data_dir=built_datasets, seed=5)
    before = bootstrap._training_fingerprint(settings)
    rendered = prompts.user_message

    def reworded(task, task_input):
        return rendered(task, task_input).replace("Avaliação:", "Comentário do cliente:")

    monkeypatch.setattr(prompts, "user_message", reworded)
    assert prompts.build_messages("extraction", ExtractionInput(review="ok"))[-1]["content"].startswith("Comentário do cliente:")
    assert bootstrap._training_fingerprint(settings) != before


def test_the_stores_later_insights_questions_move_no_other_tasks_rows(built_datasets, tmp_path, monkeypatch):
    """The store's insights questions beyond its first ones draw from a stream of their own: a build
    without them writes every other task's splits, and insights' bootstrap and holdout, byte for byte."""
    monkeypatch.setattr(datasets, "TEAM_INSIGHT_QUERIES", datasets.TEAM_INSIGHT_QUERIES[:datasets.FIRST_TEAM_INSIGHT_QUERIES])
    labelled = commerce_db.generate(tmp_path / "commerce.db", 1500, seed=5)
    datasets.build(tmp_path / "commerce.db", labelled, tmp_path / "datasets", seed=5)
    same = [(task, split) for task in TASKS for split in SPLITS if task != "insights"] + [("insights", "bootstrap"), ("insights", "holdout")]
    for task, split in same:
        path = Path(task) / f"{split}.jsonl"
        assert (tmp_path / "datasets" / path).read_bytes() == (built_datasets / "datasets" / path).read_bytes(), path
    fewer = load_split(tmp_path / "datasets", "insights", "train") + load_split(tmp_path / "datasets", "insights", "test")
    more = load_split(built_datasets / "datasets", "insights", "train") + load_split(built_datasets / "datasets", "insights", "test")
    assert len(more) > len(fewer)


def test_the_stores_insights_analyses_are_what_the_bootstrap_style_is_not(built_datasets):
    """Honest headroom: the store's own analyses (what its corrections teach) name the three largest
    rows and the smallest, and score above the general style the bootstrap fine-tunes on, on the
    same inputs; the bootstrap split holds the general style only."""
    queries = {question: advice for question, _, advice in datasets.INSIGHT_QUERIES}
    team_rows = [r for s in ("train", "eval", "test") for r in load_split(built_datasets / "datasets", "insights", s)]
    assert len(team_rows) >= 120
    team, general = [], []
    for row in team_rows:
        question = row["input"]["question"]
        advice = queries[question.split(" (dados")[0]]
        columns, rows = row["input"]["columns"], row["input"]["rows"]
        assert row["target"] == datasets.team_insights_demonstration(question, columns, rows, advice)
        team.append(tasks.score("insights", row["target"], None, RewardContext(tasks.typed_input("insights", row["input"]))).total)
        general.append(tasks.score("insights", datasets.insights_demonstration(question, columns, rows, advice), None,
                                   RewardContext(tasks.typed_input("insights", row["input"]))).total)
    assert min(team) >= 0.95
    assert sum(team) / len(team) - sum(general) / len(general) >= 0.08
    for row in load_split(built_datasets / "datasets", "insights", "bootstrap"):
        question = row["input"]["question"]
        assert row["target"] == datasets.insights_demonstration(question, row["input"]["columns"], row["input"]["rows"],
                                                                queries[question.split(" (dados")[0]])


def test_the_bootstrap_fine_tuning_gives_every_task_an_equal_share_of_its_examples():
    """Drawn in proportion to the rows, insights (76 rows against extraction's 1,194) got a thirtieth
    of the steps and the demo model's insights fell below an echo of the question."""
    from collections import Counter

    from demo.finetune import equal_shares

    rows = {"extraction": [{"id": f"e{i}"} for i in range(1194)], "insights": [{"id": f"i{i}"} for i in range(76)],
            "sql": [{"id": f"s{i}"} for i in range(219)], "empty": []}
    picked = equal_shares(rows, 640, seed=7)
    assert Counter(task for task, _ in picked) == {"extraction": 214, "insights": 214, "sql": 214}
    insights = Counter(row["id"] for task, row in picked if task == "insights")
    assert len(insights) == 76 and set(insights.values()) == {2, 3}  # every row read, none more than once an extra pass
    extraction = [row["id"] for task, row in picked if task == "extraction"]
    assert len(set(extraction)) == 214 and extraction != [f"e{i}" for i in range(214)]  # distinct rows, shuffled
    assert equal_shares(rows, 640, seed=7) == picked and equal_shares(rows, 640, seed=8) != picked
