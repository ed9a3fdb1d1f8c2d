"""rewards/ on the bootstrap's products: every reference query of the eval split and every
forbidden statement leave the DB byte for byte unchanged, the eval references score near 1 (insights,
reference-free, above 0.8) while the tiny models score clearly lower, and `tucano bench rewards` writes its results."""
from __future__ import annotations

import json
import statistics

from common.datasets import load_split
from demo.commerce_db import file_sha256
from tasks import TASKS, score, typed_input
from tests.unit.test_rewards import FORBIDDEN


def test_scoring_every_kind_of_sql_leaves_the_db_byte_for_byte_unchanged(built):
    before = file_sha256(built.db_path)
    for row in load_split(built.datasets_dir, "sql", "eval"):
        score("sql", row["reference"]["sql"], row["reference"], built.reward_context(typed_input("sql", row["input"])))
    for statement in FORBIDDEN:
        score("sql", statement, None, built.reward_context(None))
    assert file_sha256(built.db_path) == before


def test_eval_references_score_near_one_and_tiny_model_clearly_lower(built):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from router.prompts import build_messages

    means = {}
    for task in TASKS:
        name = "think" if task == "insights" else "base"
        tokenizer = AutoTokenizer.from_pretrained(built.models_dir / name)
        model = AutoModelForCausalLM.from_pretrained(built.models_dir / name)
        rows = load_split(built.datasets_dir, task, "eval")[:12]
        reference_scores, model_scores = [], []
        torch.manual_seed(0)
        for row in rows:
            context = built.reward_context(typed_input(task, row["input"]))
            reference_scores.append(score(task, row["target"], row["reference"], context).total)
            prompt = tokenizer.apply_chat_template(build_messages(task, typed_input(task, row["input"])), tokenize=False, add_generation_prompt=True)
            ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
            out = model.generate(ids, max_new_tokens=160, do_sample=True, temperature=1.0, top_p=1.0)
            model_scores.append(score(task, tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True),
                                      row["reference"], context).total)
        means[task] = (statistics.mean(reference_scores), statistics.mean(model_scores))
        print(f"{task:<11} reference mean {means[task][0]:.3f}   tiny model mean {means[task][1]:.3f}")
    for task, (ref_mean, model_mean) in means.items():
        assert ref_mean >= (0.97 if task != "insights" else 0.8), task  # insights is scored without a reference
        assert model_mean < ref_mean - 0.05, task


def test_bench_rewards_cli_writes_results(built):
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {"TUCANO_DATA_DIR": str(built.data_dir), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "cli", "bench", "rewards", "--seconds", "0.2"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    written = json.loads((built.bench_dir / "rewards.json").read_text())
    assert set(written["results"]) == {"extraction", "sql", "sql_simple", "push", "insights"}
    assert all(r["scores_per_s"] > 0 for r in written["results"].values())
