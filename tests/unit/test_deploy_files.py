"""The fleet's deploy files parse with the real parsers here (Debian's `docker-compose config`,
the Kubernetes client's models) and describe what the project runs: every vLLM engine's flags
are `vllm_command`'s for a GPU (a difference fails naming the flag), the engines and the trainer
ask for a GPU, the data volume is ReadWriteMany, the gateways are ready on /readyz with keys from
a Secret, and gateways and engines have disruption budgets."""
from __future__ import annotations

import os
import shutil
import subprocess

import pydantic
import pytest
import yaml

from deploy.vllm_server import vllm_command, vllm_env
from tests.conftest import REPO

COMPOSE = REPO / "deploy" / "compose" / "compose.yaml"
K8S = REPO / "deploy" / "k8s" / "tucano.yaml"
ENGINES = {"base": "/data/models/base", "think": "/data/models/think"}


def expected_command(kind: str) -> list[str]:
    """The engine's command line in a container: `vllm_command` for a GPU, its interpreter aside."""
    return vllm_command(ENGINES[kind], kind, 8000, lora=True, device="cuda", host="0.0.0.0")[1:]


def flag_differences(expected: list[str], actual: list[str]) -> list[str]:
    """Each flag whose presence or value differs, named, e.g. `--max-loras: 4 != 8`."""
    def flags(argv):
        out, i = {}, 0
        while i < len(argv):
            if argv[i].startswith("--"):
                has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
                out[argv[i]] = argv[i + 1] if has_value else True
                i += 2 if has_value else 1
            else:
                out.setdefault("(positional)", []).append(argv[i])
                i += 1
        return out

    want, got = flags(expected), flags(actual)
    return [f"{flag}: {want.get(flag, '(absent)')} != {got.get(flag, '(absent)')}"
            for flag in sorted(set(want) | set(got)) if want.get(flag) != got.get(flag)]


def test_a_differing_flag_is_named():
    command = expected_command("base")
    changed = [*command[:-1], "8"]  # --max-loras 8
    assert flag_differences(command, changed) == ["--max-loras: 4 != 8"]
    assert flag_differences(command, [a for a in command if a != "--enable-lora"]) == ["--enable-lora: True != (absent)"]
    assert flag_differences(command, command) == []


@pytest.fixture(scope="module")
def compose() -> dict:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.fail("the deploy-file test needs Debian's docker-compose: `apt-get install docker-compose` (scripts/install.sh does)")
    env = dict(os.environ, TUCANO_USER_API_KEY="user", TUCANO_ADMIN_API_KEY="admin")
    shown = subprocess.run([tool, "-f", str(COMPOSE), "config"], env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    return yaml.safe_load(shown.stdout)


def test_compose_engines_run_vllm_command_and_the_fleet_is_complete(compose):
    services = compose["services"]
    assert {"valkey", "vllm-base-1", "vllm-base-2", "vllm-think", "gateway", "loadbalancer", "trainer", "prometheus"} <= set(services)
    for name, kind in (("vllm-base-1", "base"), ("vllm-base-2", "base"), ("vllm-think", "think")):
        service = services[name]
        argv = service["entrypoint"][1:] + service["command"]  # python3 -m … + flags
        assert not flag_differences(expected_command(kind), argv), (name, flag_differences(expected_command(kind), argv))
        assert service["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == vllm_env("cuda", True)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"]
        assert service["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "--appendonly" in services["valkey"]["command"] and services["valkey"]["volumes"]
    gateway = services["gateway"]
    assert gateway["deploy"]["replicas"] >= 2 and gateway["environment"]["TUCANO_TRAIN_ENABLED"] == "false"
    assert gateway["environment"]["TUCANO_USER_API_KEY"] == "user"  # from the environment, never written in the file
    assert services["trainer"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_compose_refuses_to_start_without_keys():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUCANO_")}
    shown = subprocess.run([shutil.which("docker-compose") or "docker-compose", "-f", str(COMPOSE), "config"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode != 0 and "TUCANO_USER_API_KEY" in shown.stderr


@pytest.fixture(scope="module")
def manifests() -> dict[tuple[str, str], object]:
    """Every object in the manifests, deserialised into the Kubernetes client's model of its kind
    (which refuses a missing required field or a wrong type)."""
    from kubernetes.client import ApiClient

    client = ApiClient()
    out = {}
    for document in yaml.safe_load_all(K8S.read_text()):
        version = document["apiVersion"].split("/")[-1].capitalize()
        model = client._ApiClient__deserialize(document, f"{version}{document['kind']}")
        assert model.metadata.name == document["metadata"]["name"]
        out[document["kind"], document["metadata"]["name"]] = model
    return out


def test_kubernetes_engines_run_vllm_command_with_a_gpu_each(manifests):
    for name, kind in (("vllm-base", "base"), ("vllm-think", "think")):
        container = manifests["StatefulSet", name].spec.template.spec.containers[0]
        argv = container.command[1:] + container.args
        assert not flag_differences(expected_command(kind), argv), (name, flag_differences(expected_command(kind), argv))
        assert container.resources.limits["nvidia.com/gpu"] == "1"
        assert container.readiness_probe.http_get.path == "/health"
        assert {e.name: e.value for e in container.env}["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert manifests["StatefulSet", "vllm-base"].spec.replicas >= 2


def test_kubernetes_gateways_trainer_storage_and_budgets(manifests):
    gateway = manifests["Deployment", "gateway"].spec.template.spec.containers[0]
    assert gateway.readiness_probe.http_get.path == "/readyz" and manifests["Deployment", "gateway"].spec.replicas >= 2
    keys = {e.name: e.value_from.secret_key_ref.name for e in gateway.env if e.value_from}
    assert keys == {"TUCANO_USER_API_KEY": "tucano-keys", "TUCANO_ADMIN_API_KEY": "tucano-keys"}
    assert ("Secret", "tucano-keys") in manifests
    trainer = manifests["Deployment", "trainer"].spec.template.spec.containers[0]
    assert trainer.resources.limits["nvidia.com/gpu"] == "1" and trainer.args == ["tucano", "train"]
    assert manifests["PersistentVolumeClaim", "tucano-data"].spec.access_modes == ["ReadWriteMany"]
    for name in ("gateway", "vllm-base"):
        assert manifests["PodDisruptionBudget", name].spec.selector.match_labels == {"app": name}
    urls = {e.name: e.value for e in gateway.env if e.value}
    assert "vllm-base-1.vllm-base" in urls["TUCANO_BASE_ENGINE_URLS"]  # one per StatefulSet replica


def test_the_kubernetes_models_refuse_a_malformed_object():
    from kubernetes.client import ApiClient

    broken = yaml.safe_load(K8S.read_text().split("---")[-1])  # the vllm-base disruption budget
    broken["spec"]["selector"] = "app=vllm-base"
    with pytest.raises(pydantic.ValidationError, match="V1LabelSelector"):
        ApiClient()._ApiClient__deserialize(broken, "V1PodDisruptionBudget")
