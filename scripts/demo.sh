#!/usr/bin/env bash
# Sets everything up, then runs a real multi-rank traced job that goes wrong and prints its report.
# Extra arguments go to `colltrace demo` (e.g. --scenario rank_exception, --list).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/setup.sh
exec .venv/bin/colltrace demo "$@"
