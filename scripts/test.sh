#!/usr/bin/env bash
# Sets everything up, then lints and runs the whole test suite (real multi-process runs included).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/setup.sh
.venv/bin/ruff check colltrace tests bench
.venv/bin/ruff format --check colltrace tests bench
.venv/bin/mypy
.venv/bin/python -m pytest -n 2 -q "$@"
