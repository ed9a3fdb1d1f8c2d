"""The bootstrap's products, checked against contract §4 and §7, and its repair behaviour."""
from __future__ import annotations

import csv
import errno
import json
import sqlite3
import subprocess
import sys

import pytest

from common.datasets import SPLITS, input_key, load_split
from common.settings import load_settings
from demo import bootstrap, commerce_db, datasets
from tasks import TASKS, typed_input
from tests.conftest import REPO, SHARED

PRODUCT_SCHEMA = {
    "olist_orders_dataset": ["order_id", "customer_id", "order_status", "order_purchase_timestamp", "order_approved_at",
                             "order_delivered_carrier_date", "order_delivered_customer_date", "order_estimated_delivery_date"],
    "olist_order_items_dataset": ["order_id", "order_item_id", "product_id", "seller_id", "shipping_limit_date", "price",
                                  "freight_value"],
    "olist_order_payments_dataset": ["order_id", "payment_sequential", "payment_type", "payment_installments", "payment_value"],
    "olist_order_reviews_dataset": ["review_id", "order_id", "review_score", "review_comment_title", "review_comment_message",
                                    "review_creation_date", "review_answer_timestamp"],
    "olist_customers_dataset": ["customer_id", "customer_unique_id", "customer_zip_code_prefix", "customer_city",
                                "customer_state"],
    "olist_sellers_dataset": ["seller_id", "seller_zip_code_prefix", "seller_city", "seller_state"],
    "olist_products_dataset": ["product_id", "product_category_name", "product_name_lenght", "product_description_lenght",
                               "product_photos_qty", "product_weight_g", "product_length_cm", "product_height_cm",
                               "product_width_cm"],
    "product_category_name_translation": ["product_category_name", "product_category_name_english"],
}
UFS = set("AC AL AP AM BA CE DF ES GO MA MT MS MG PA PB PR PE PI RJ RN RS RO RR SC SP SE TO".split())


@pytest.fixture(scope="module")
def db(built):
    con = sqlite3.connect(f"file:{built.db_path}?mode=ro", uri=True)
    yield con
    con.close()


def test_schema_matches_the_contract(db):
    for table, columns in PRODUCT_SCHEMA.items():
        assert [row[1] for row in db.execute(f"PRAGMA table_info({table})")] == columns
    kinds = dict(db.execute("SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')"))
    assert set(kinds) == set(PRODUCT_SCHEMA) | {"orders_enriched"}
    assert kinds["orders_enriched"] == "view"
    view_columns = {row[1] for row in db.execute("PRAGMA table_info(orders_enriched)")}
    assert {"order_id", "product_category_name_english", "customer_state", "payment_type", "review_score", "price"} <= view_columns
    # the view has one row per order item, payments and reviews aggregated per order
    assert db.execute("SELECT COUNT(*) FROM orders_enriched").fetchone() == \
        db.execute("SELECT COUNT(*) FROM olist_order_items_dataset").fetchone()


def test_value_domains_and_sizes(db):
    one = lambda sql: db.execute(sql).fetchone()[0]
    assert one("SELECT COUNT(*) FROM olist_orders_dataset") >= 5000
    statuses = dict(db.execute("SELECT order_status, COUNT(*) FROM olist_orders_dataset GROUP BY 1"))
    assert set(statuses) <= {"delivered", "shipped", "canceled", "unavailable", "invoiced", "processing", "created", "approved"}
    assert 0.94 < statuses["delivered"] / sum(statuses.values()) < 0.99
    payments = dict(db.execute("SELECT payment_type, COUNT(*) FROM olist_order_payments_dataset GROUP BY 1"))
    assert set(payments) <= {"credit_card", "boleto", "voucher", "debit_card", "not_defined"}
    assert 0.68 < payments["credit_card"] / sum(payments.values()) < 0.80
    assert 0.14 < payments["boleto"] / sum(payments.values()) < 0.24
    assert {r[0] for r in db.execute("SELECT DISTINCT customer_state FROM olist_customers_dataset")} == UFS
    assert one("SELECT MIN(payment_installments) FROM olist_order_payments_dataset") >= 1
    assert one("SELECT MAX(payment_installments) FROM olist_order_payments_dataset") <= 24
    assert one("SELECT MIN(review_score) FROM olist_order_reviews_dataset") == 1
    assert one("SELECT MAX(review_score) FROM olist_order_reviews_dataset") == 5
    with_text = one("SELECT AVG(review_comment_message IS NOT NULL) FROM olist_order_reviews_dataset")
    assert 0.2 < with_text < 0.5  # most reviews have no text
    first, last = db.execute("SELECT MIN(order_purchase_timestamp), MAX(order_purchase_timestamp) FROM olist_orders_dataset").fetchone()
    assert first >= "2016-09" and last < "2018-11"
    cities = [r[0] for r in db.execute("SELECT DISTINCT customer_city FROM olist_customers_dataset")]
    assert all(c == c.lower() and c.isascii() for c in cities)
    assert one("SELECT COUNT(*) FROM olist_sellers_dataset") > 0 and one("SELECT COUNT(*) FROM olist_products_dataset") > 0


def test_categories_are_the_shared_71(db):
    rows = set(db.execute("SELECT product_category_name, product_category_name_english FROM product_category_name_translation"))
    assert len(rows) == 71
    source = SHARED / "data" / "olist_product_categories.csv"
    if not source.exists():  # the packaged copy is what the DB is built from
        source = commerce_db.CATEGORIES_CSV
    with source.open() as f:
        assert rows == {(r["product_category_name"], r["product_category_name_english"]) for r in csv.DictReader(f)}


def test_every_reference_sql_executes_and_returns_rows(built, db):
    patterns = set()
    for split in SPLITS:
        for row in load_split(built.datasets_dir, "sql", split):
            result = db.execute(row["reference"]["sql"]).fetchall()
            assert result and any(v is not None for v in result[0]), row
            patterns.add(row["pattern"])
    assert len(patterns) >= 40


def test_no_input_is_in_two_splits(built):
    for task in TASKS:
        keys = {split: {input_key(r["input"]) for r in load_split(built.datasets_dir, task, split)} for split in SPLITS}
        assert all(keys.values()), task
        for a in SPLITS:
            for b in SPLITS:
                assert a == b or not keys[a] & keys[b], (task, a, b)


def test_extraction_references_are_complete_and_grounded(built):
    rows = load_split(built.datasets_dir, "extraction", "train")
    categories = {r["reference"]["complaint_category"] for r in rows}
    assert len(categories) >= 9
    for row in rows:
        ref = row["reference"]
        assert len(ref) == 10 and 1.0 <= ref["sentiment_score"] <= 5.0 and len(ref["summary"]) <= 200
        assert all(phrase in row["input"]["review"] for phrase in ref["key_phrases"])
        assert ref["product_mentioned"] is None or ref["product_mentioned"] in row["input"]["review"]


def test_manifest_records_seed_timings_and_sizes(built):
    manifest = json.loads(built.manifest_path.read_text())
    assert manifest["seed"] == built.seed
    assert manifest["model"] == "tiny"
    for step in bootstrap.steps_of(built):
        assert manifest["steps"][step]["seconds"] >= 0
    for name in ("base_model", "think_model"):
        info = manifest["steps"][name]
        assert 500_000 < info["parameters"] < 2_000_000
        assert info["final_sft_loss"] < 2.0


@pytest.mark.parametrize("name,think", [("base", False), ("think", True)])
def test_models_load_generate_and_chat_template_round_trips(built, name, think):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = built.models_dir / name
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == "qwen3" and model.config.vocab_size == 4096
    assert len(tokenizer) <= model.config.vocab_size
    messages = [{"role": "system", "content": "Você é útil."}, {"role": "user", "content": "Olá, ação é ótima! 🎉"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\nVocê é útil.<|im_end|>\n<|im_start|>user\n")
    assert prompt.endswith("<|im_start|>assistant\n<think>\n" if think else "<|im_start|>assistant\n")
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == prompt  # byte-level BPE: lossless, PT-BR accents and emoji included
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id
    torch.manual_seed(0)
    out = model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False)
    text = tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    assert text.strip()


def test_base_model_emits_task_shaped_output(built):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from router.prompts import build_messages

    path = built.models_dir / "base"
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    row = load_split(built.datasets_dir, "push", "bootstrap")[0]
    prompt = tokenizer.apply_chat_template(build_messages("push", typed_input("push", row["input"])), tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    torch.manual_seed(0)
    text = tokenizer.decode(model.generate(ids, max_new_tokens=80, do_sample=False)[0, ids.shape[1]:], skip_special_tokens=True)
    assert text.lstrip().startswith('{"title"'), text


# --- idempotence and repair, on a small fast configuration ----------------------------------

@pytest.fixture
def small(tmp_path):
    return load_settings(data_dir=tmp_path / "data", bootstrap_orders=600, bootstrap_lm_steps=0, bootstrap_sft_steps=2)


def test_rerun_skips_finished_steps_and_repairs_half_built_ones(small):
    first = bootstrap.run(small)
    db_sha = first["steps"]["commerce_db"]["sha256"]
    model_seconds = first["steps"]["base_model"]["seconds"]
    second = bootstrap.run(small)
    assert second["steps"]["commerce_db"]["sha256"] == db_sha
    assert second["steps"]["base_model"]["seconds"] == model_seconds  # not rebuilt

    # a half-built later run: leftovers, a missing model, a DB that was tampered with
    (small.root / "base_model.partial").mkdir()
    (small.root / "base_model.partial" / "junk").write_text("x")
    (small.models_dir / "think" / "config.json").unlink()
    with sqlite3.connect(small.db_path) as con:
        con.execute("DELETE FROM olist_orders_dataset WHERE rowid < 10")
    repaired = bootstrap.run(small)
    assert not list(small.root.glob("*.partial"))
    assert (small.models_dir / "think" / "config.json").exists()
    assert repaired["steps"]["commerce_db"]["sha256"] == db_sha  # rebuilt identically from the seed
    assert bootstrap.is_built(small)


def test_the_bootstrap_reports_in_plain_lines_where_stdout_is_a_log(built):
    """Run with its output to a pipe, as under a supervisor: a line per stage (a bar would draw nothing),
    on stderr with the CLI's other reports."""
    import os

    result = subprocess.run([sys.executable, "-m", "cli", "bootstrap"], cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TUCANO_DATA_DIR": str(built.data_dir)})
    assert result.returncode == 0, result.stderr
    started = [line.split(" started")[0] for line in result.stderr.splitlines() if " started, " in line]
    assert started == [f"bootstrap: {stage}" for stage in bootstrap.expected_seconds(built)], result.stderr
    assert all(" spent, " in line and line.endswith(" left") for line in result.stderr.splitlines() if line.startswith("bootstrap: "))


def test_unwritable_data_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    settings = load_settings(data_dir=blocker / "data")
    with pytest.raises(bootstrap.BootstrapError, match="not writable"):
        bootstrap.run(settings)
    result = subprocess.run([sys.executable, "-m", "cli", "bootstrap"], cwd=REPO, capture_output=True, text=True,
                            env={"TUCANO_DATA_DIR": str(blocker / "data"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 1 and "not writable" in result.stderr
    assert "Traceback" not in result.stderr


def test_full_disk_is_a_clear_error_and_a_rerun_finishes(small, monkeypatch):
    real_build = datasets.build

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(datasets, "build", full)
    with pytest.raises(bootstrap.BootstrapError, match="no space left"):
        bootstrap.run(small)
    assert "datasets" not in bootstrap.read_manifest(small)["steps"]  # the DB step was kept
    monkeypatch.setattr(datasets, "build", real_build)
    bootstrap.run(small)
    assert bootstrap.is_built(small)
