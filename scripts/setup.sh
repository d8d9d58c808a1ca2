#!/usr/bin/env bash
# Creates .venv (Python 3.10+) with torch 2.13.0 (CPU build), colltrace and its test tools.
# A .venv already set up from the same pyproject.toml and this script is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.colltrace-setup
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
# DeepSpeed builds its CPU op at its first run (minutes, silently); a killed build left a lock that hung
# every later DeepSpeed job: built here once under a time limit, a stale lock removed (scripts/deepspeed_op.py)
deepspeed_op() { .venv/bin/python scripts/deepspeed_op.py || true; }
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && .venv/bin/python -c "import torch, colltrace, orjson" 2>/dev/null; then
  deepspeed_op
  exit 0
fi
# torch==2.13.0 exactly: any other spec may download a multi-GB CUDA build
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" -e ".[record,tui,dev]" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
.venv/bin/python -c "import torch, colltrace, orjson" >/dev/null
echo "$want" > "$stamp"
deepspeed_op
