#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine, then run it.
# This is the README's test command; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# Headless Chromium for the dashboard's and the HTML report's browser tests.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium chromium-driver >/dev/null
fi

# A project venv that still sees nothing of the system's packages.
python3 -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first and pinned: 2.13.0 is the CPU build on local disk; anything else pulls CUDA.
pip install -q torch==2.13.0
pip install -q -e ".[test,app]"
# HTA is the cross-check oracle. Its metadata pulls in jupyterlab, which it never imports:
# install it without that, plus the modules it does import.
pip install -q --no-deps HolisticTraceAnalysis==0.5.0
pip install -q networkx pydot pyyaml psutil ijson

# Lint, format, types and import layers (pyproject.toml) before the tests: CI fails on any.
ruff check .
ruff format --check .
mypy
lint-imports

python -m pytest -q -n 2 --dist loadgroup "$@"
