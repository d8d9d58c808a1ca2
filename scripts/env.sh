# Sourced by setup.sh, test.sh and demo.sh: what every command of this checkout runs with.
# DeepSpeed builds its CPU op under torch's extension directory, shared by every venv of this Python and torch
# by default: another checkout's venv rebuilt it there, and a job waited on that build's lock. One per checkout.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.venv/torch_extensions}"
