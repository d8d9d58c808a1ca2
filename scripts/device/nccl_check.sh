#!/usr/bin/env bash
# colltrace on the NCCL backend with CUDA tensors, world size 1, on one GPU. Run on a GPU machine
# from the repository root (the device tool runs it there); needs no network. What it writes goes
# to $OUT: log.txt (every step and check) and runs.tar.gz (the traces, the jobs' logs and facts).
#
#   1. train     FSDP2 + DDP + the other collectives, then completion against the device
#                (scripts/device/nccl_job.py MODE=train), checked by nccl_verify.py
#   2. hang      a collective queued behind a GPU sleep longer than the group's timeout:
#                NCCL's watchdog aborts the process; the trace must show that collective in flight
#   3. overhead  host time per blocking all_reduce and per FSDP2 step, traced vs untraced
#   4. graph     all_reduces captured in a CUDA graph, replayed: the shim must not break the capture
#   5. diverge   two ranks, rank 1 skipping an all_reduce (not in the default PARTS: needs 2 GPUs)
#   6. memory    FSDP2 leaking 256 MB of device memory a step under a 5 % cap until CUDA's OutOfMemoryError:
#                cuda_memory events with the unit the peak rose in, the error's size, the report's oom
# PARTS="hang" runs only some of them (train hang overhead graph diverge memory).
set -u
OUT=${OUT:-/tmp/nccl-check-out}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=/tmp/nccl-check
PY=${PY:-python3}
rm -rf "$WORK" && mkdir -p "$WORK/runs" "$OUT"
cd "$ROOT" || exit 1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4

main() {
    nvidia-smi -L
    $PY -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
    if ls .whl/*.whl >/dev/null 2>&1; then  # orjson, carried as a wheel
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    fi
    export PYTHONPATH="$ROOT:/tmp/site"
    local site
    # COLLTRACE=1 at interpreter start, as `pip install` sets it up (colltrace.pth)
    site=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if cp colltrace.pth "$site/" 2>/dev/null; then
        echo "colltrace.pth -> $site"
    else
        printf 'import os\nos.environ.get("COLLTRACE") and __import__("colltrace._startup")\n' >/tmp/site/sitecustomize.py
        echo "colltrace.pth not writable there: sitecustomize in /tmp/site"
    fi

    local part
    for part in ${PARTS:-train hang overhead memory}; do "part_$part"; done
}

part_train() {
    job train train 180
    verify train train
}

part_hang() {  # NCCL's watchdog times the collective out after 8 s; the dump it then writes waits 3 s at most
    # (into the run directory's flight_recorder/, where COLLTRACE=1 steers TORCH_FR_DUMP_TEMP_FILE; the report joins it)
    PG_TIMEOUT=8 HANG_SLEEP_S=300 COLLTRACE_HANG_S=3 TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC=3000 \
        TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_ENABLE_TIMING=1 \
        job hang hang 120
    verify hang hang
}

part_diverge() {  # two ranks on one GPU: NCCL 2.28.9 refuses ("Duplicate GPU detected"); kept for machines with 2+ GPUs
    echo "== job diverge (MODE=diverge, 2 ranks on one GPU)"
    local t0=$(date +%s)
    MODE=diverge PG_TIMEOUT=10 COLLTRACE_HANG_S=4 NCCL_DEBUG=WARN COLLTRACE=1 COLLTRACE_DIR="$WORK/runs/diverge" \
        FACTS="$WORK/runs/diverge.facts.json" timeout 100 $PY -m torch.distributed.run --standalone \
        --nproc-per-node 2 scripts/device/nccl_job.py >"$WORK/runs/diverge.log" 2>&1
    echo "   exit $? after $(($(date +%s) - t0)) s"
    grep -i -E "nccl_job|duplicate|error|timeout|exitcode" "$WORK/runs/diverge.log" | cut -c1-300 | head -n 20 | sed 's/^/   | /'
    $PY -m colltrace dump "$WORK/runs/diverge" >"$WORK/runs/diverge.dump.jsonl" 2>&1
    $PY -c "
import json
for l in open('$WORK/runs/diverge.dump.jsonl'):
    if l.startswith('{'):
        d = json.loads(l); print('  ', d['rank'], d['seq'], d['op'], d['numel'], d['status'], d['on_device'])" 2>&1 | head -n 20
    echo "== colltrace report diverge"
    $PY -m colltrace report "$WORK/runs/diverge" 2>&1 | head -n 50
}

part_memory() {
    job memory memory 180
    echo "== memory events (rank 0)"
    grep -h -E '"ev":"(cuda_memory|memory_limits)"' "$WORK/runs/memory/rank00000.jsonl" | tail -n 4 | cut -c1-400
    grep -h -o '"oom_size":[-0-9]*' "$WORK/runs/memory/rank00000.jsonl" | head -n 2
    echo "== colltrace report memory"
    $PY -m colltrace report "$WORK/runs/memory" 2>&1 | sed -n '1,/^#### Aligned/p' | head -n 30
    $PY -m colltrace report "$WORK/runs/memory" 2>&1 | sed -n '/^#### Memory/,/^#### Env/p'
}

part_graph() {  # collectives captured in a CUDA graph: the capture and the replays must work as without colltrace
    TRACE=0 job graph-untraced graph 120  # the baseline: does this torch capture NCCL at all
    job graph graph 120
    $PY scripts/device/nccl_verify.py graph "$WORK/runs/graph" "$WORK/runs/graph.facts.json"
}

part_overhead() {
    job overhead overhead 240
    $PY -c "import json; d = json.load(open('$WORK/runs/overhead.facts.json')); d.pop('samples', None); print(json.dumps(d, indent=1))"
}

job() {  # job NAME MODE TIMEOUT: one torchrun, traced into $WORK/runs/NAME
    local name=$1 mode=$2 limit=$3 t0 rc
    echo "== job $name (MODE=$mode)"
    t0=$(date +%s)
    MODE=$mode COLLTRACE=${TRACE:-1} COLLTRACE_DIR="$WORK/runs/$name" FACTS="$WORK/runs/$name.facts.json" \
        timeout "$limit" $PY -m torch.distributed.run --standalone --nproc-per-node 1 scripts/device/nccl_job.py \
        >"$WORK/runs/$name.log" 2>&1
    rc=$?
    echo "   exit $rc after $(($(date +%s) - t0)) s; last lines of its log:"
    grep -v -i "warn" "$WORK/runs/$name.log" | tail -n 8 | sed 's/^/   | /'
}

verify() {  # verify MODE NAME
    echo "== verify $2"
    $PY scripts/device/nccl_verify.py "$1" "$WORK/runs/$2" "$WORK/runs/$2.facts.json"
    echo "== colltrace report $2"
    $PY -m colltrace report "$WORK/runs/$2" 2>&1 | head -n 40
    echo "   (exit ${PIPESTATUS[0]})"
    $PY -m colltrace dump "$WORK/runs/$2" >"$WORK/runs/$2.dump.jsonl" 2>&1
}

main 2>&1 | tee "$OUT/log.txt"
tar -C "$WORK" -czf "$OUT/runs.tar.gz" runs
ls -la "$OUT"
