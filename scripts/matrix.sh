#!/usr/bin/env bash
# The compatibility matrix: one venv per (Python, torch) cell, colltrace from this checkout on its path, and
# scripts/matrix_cell.py run in it (real torchrun jobs on gloo: recording and diagnosis, the torch.compile
# test, what that torch has that colltrace does not trace). Prints a Markdown table, one row per cell, for
# docs/compat.md. Not part of .ci/run: each cell installs a torch (some download several GB) and runs for minutes.
#
#   bash scripts/matrix.sh                      # the cells below
#   bash scripts/matrix.sh 3.11:2.13.0 3.12:2.14.1
#   MATRIX_DIR=/scratch/matrix bash scripts/matrix.sh
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
DIR=${MATRIX_DIR:-/tmp/colltrace-matrix}
CELLS=("$@")
[ ${#CELLS[@]} -eq 0 ] && CELLS=(3.11:2.13.0 3.11:2.14.1 3.11:2.15.0 3.11:2.4.1 3.10:2.13.0 3.12:2.14.1 3.13:2.14.1)
mkdir -p "$DIR"
rows=()
for cell in "${CELLS[@]}"; do
  py=${cell%%:*}; torch=${cell#*:}
  venv="$DIR/py$py-torch$torch"
  log="$DIR/py$py-torch$torch.log"
  echo "== Python $py, torch $torch ($venv)" >&2
  pybin=""  # python3.12 on PATH, else pyenv's build of it (its shim answers only when that version is active)
  for cand in "python$py" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$py".*/bin/python"$py"; do
    if "$cand" -c "import sys" 2>/dev/null; then pybin=$cand; break; fi
  done
  if [ -z "$pybin" ]; then rows+=("| $py | $torch | not run: no python$py here | |"); continue; fi
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    "$pybin" -m venv "$venv" && "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      "torch==$torch" numpy orjson textual pytest >"$log" 2>&1
  fi
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    rows+=("| $py | $torch | not run: torch==$torch did not install ($(tail -1 "$log" | cut -c1-120)) | |"); continue
  fi
  site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$REPO" > "$site/colltrace_src.pth"  # this checkout, and its startup hook (COLLTRACE=1)
  cp "$REPO/colltrace.pth" "$site/zz_colltrace.pth"
  got=$(cd "$DIR" && "$venv/bin/python" "$REPO/scripts/matrix_cell.py" --out "$venv-runs" 2>>"$log" | tee -a "$log" | tail -1)
  rows+=("$(python3 "$REPO/scripts/matrix_cell.py" --row "$got" 2>/dev/null || echo "| $py | $torch | FAIL: no result (see $log) | |")")
done
echo "| Python | torch | recording and diagnosis | not traced |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
