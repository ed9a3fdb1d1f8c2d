import json
import subprocess
import sys

import pytest

from common.settings import ConfigError, load_settings
from tasks import check_settings, training_settings
from tests.conftest import REPO

TUCANO = [sys.executable, "-m", "cli"]


def test_defaults_and_derived_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("TUCANO_DATA_DIR", str(tmp_path))
    settings = load_settings()
    assert settings.root == tmp_path.resolve()
    assert settings.db_path == tmp_path.resolve() / "commerce.db"
    assert settings.redis_url is None and settings.base_engine_urls == []
    assert settings.base_model_path.endswith("models/base")


def test_env_and_toml_file(tmp_path, monkeypatch):
    config = tmp_path / "tucano.toml"
    config.write_text('port = 9100\nbase_engine_urls = ["http://10.0.0.5:8000/"]\nmin_records_per_task = 7\n')
    monkeypatch.setenv("TUCANO_CONFIG", str(config))
    monkeypatch.setenv("TUCANO_MIN_RECORDS_PER_TASK", "11")  # the environment wins over the file
    settings = load_settings()
    assert settings.port == 9100
    assert settings.base_engine_urls == ["http://10.0.0.5:8000"]
    assert settings.min_records_per_task == 11


@pytest.mark.parametrize("name,value", [
    ("TUCANO_PORT", "eighty"),
    ("TUCANO_PORT", "70000"),
    ("TUCANO_REDIS_URL", "http://localhost:6379"),
    ("TUCANO_BASE_ENGINE_URLS", '["ftp://x"]'),
    ("TUCANO_TRAIN_METHOD", "ppo"),
    ("TUCANO_GATEWAY_WORKERS", "0"),
    ("TUCANO_BASE_ENGINE_URLS", "http://10.0.0.5:8000"),  # a list setting is JSON
    ("TUCANO_TASK_TRAINING", "extraction=0.001"),
    ("TUCANO_TASK_TRAINING", '{"extractoin": {"train_learning_rate": 0.001}}'),
    ("TUCANO_TASK_TRAINING", '{"sql": {"train_learning_rate": 2}}'),
    ("TUCANO_TASK_TRAINING", '{"sql": {"sft_batch_size": 0}}'),
    ("TUCANO_TASK_TRAINING", '{"sql": {"learning_rate": 0.001}}'),
    ("TUCANO_TASK_TRAINING", '{"sql": {"grpo_num_generations": 1}}'),  # a group of one has no spread to learn from
    ("TUCANO_GRPO_BETA", "-0.1"),  # a KL penalty below 0 would pay drifting from the base model
    ("TUCANO_GRPO_BETA", "11"),
    ("TUCANO_TASK_TRAINING", '{"push": {"grpo_beta": -1}}'),
    ("TUCANO_SERVE_SAMPLES", '{"pushh": 2}'),
    ("TUCANO_EXAMPLES_TASKS", '["sql", "translation"]'),
    ("TUCANO_SERVE_SAMPLES_CAP", "2"),  # below push's own 4
])
def test_bad_setting_is_named(monkeypatch, name, value):
    """As every entry point reads them: loaded, then checked against the task registry (a setting
    that names a task no entry has is refused there, since the settings know no task)."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        check_settings(load_settings())


def test_unknown_key_in_file_and_missing_file_are_named(tmp_path, monkeypatch):
    config = tmp_path / "tucano.toml"
    config.write_text("prot = 1\n")
    monkeypatch.setenv("TUCANO_CONFIG", str(config))
    with pytest.raises(ConfigError, match="TUCANO_PROT"):
        load_settings()
    monkeypatch.setenv("TUCANO_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="TUCANO_CONFIG"):
        load_settings()


def test_cli_bad_setting_exits_2_with_the_name(monkeypatch):
    env = {"TUCANO_PORT": "eighty", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(TUCANO + ["bootstrap"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 2
    assert "TUCANO_PORT" in result.stderr


@pytest.mark.parametrize("args", [["no-such-command"], ["bootstrap", "--no-such-option"], ["adapters", "frobnicate"]])
def test_cli_unknown_command_or_option_is_usage_error(args):
    result = subprocess.run(TUCANO + args, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2
    assert "Usage" in result.stderr


def test_the_configuration_page_documents_every_setting_with_its_default():
    from common.settings import Settings

    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip(" `") for line in (REPO / "docs" / "configuration.md").read_text().splitlines()
            if line.startswith("| `TUCANO_")}
    for name, field in Settings.model_fields.items():
        default = field.default if field.default_factory is None else field.default_factory()
        shown = ("unset" if default is None else str(default).lower() if isinstance(default, bool)
                 else json.dumps(default) if isinstance(default, dict) else str(default))
        assert rows.get(f"TUCANO_{name.upper()}") == shown, name


def test_a_task_trains_with_its_own_training_settings_and_the_others_with_the_general_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("TUCANO_TASK_TRAINING", '{"sql": {"train_learning_rate": 0.0005, "sft_batch_size": 2}}')
    monkeypatch.setenv("TUCANO_TRAIN_TIME_BUDGET_S", "30")
    settings = load_settings()
    sql = training_settings(settings, "sql")
    assert (sql.train_learning_rate, sql.sft_batch_size, sql.train_time_budget_s) == (0.0005, 2, 30.0)
    assert sql.grpo_num_generations == 4  # the general one: setting task_training replaced SQL's own 8
    for task in ("push", "extraction", "insights"):  # setting it replaces the default whole: extraction's own is gone
        own = training_settings(settings, task)
        assert (own.train_learning_rate, own.sft_batch_size, own.train_time_budget_s) == (0.003, 8, 30.0)
    config = tmp_path / "tucano.toml"
    config.write_text("[task_training.push]\ntrain_time_budget_s = 20\n")
    monkeypatch.delenv("TUCANO_TASK_TRAINING")
    monkeypatch.setenv("TUCANO_CONFIG", str(config))
    assert training_settings(load_settings(), "push").train_time_budget_s == 20.0


def test_each_task_trains_with_its_own_defaults():
    settings = load_settings()
    extraction, insights = training_settings(settings, "extraction"), training_settings(settings, "insights")
    assert (extraction.train_learning_rate, extraction.sft_batch_size, extraction.train_time_budget_s, extraction.sft_from_liked) == (
        0.001, 4, 120.0, False)
    assert (insights.train_learning_rate, insights.sft_batch_size, insights.train_time_budget_s, insights.sft_from_liked) == (
        0.002, 4, 90.0, False)
    sql, push = training_settings(settings, "sql"), training_settings(settings, "push")
    assert (sql.train_learning_rate, sql.sft_batch_size, sql.train_time_budget_s, sql.sft_from_liked) == (0.003, 8, 45.0, True)
    # SQL, push and extraction the larger groups they gained with (tasks/); insights the general 4
    assert [training_settings(settings, t).grpo_num_generations for t in ("sql", "push", "extraction", "insights")] == [8, 8, 8, 4]
    # push the longer budget its GRPO's larger batches take (tasks/push.py)
    assert (push.train_learning_rate, push.sft_batch_size, push.train_time_budget_s, push.sft_from_liked) == (0.003, 8, 75.0, True)
