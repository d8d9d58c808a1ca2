"""Copies a run directory recorded on the GPU machine into fixtures/device/NAME, its rings cut to
the records they hold (a ring is 12 MiB at the default capacity; these hold a few dozen records).

    python scripts/device/keep_run.py RUN_DIR NAME [EXTRA_FILE ...]

EXTRA_FILEs (the job's facts.json, Flight Recorder's dump) are copied beside the traces."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from colltrace.trace import schema
from colltrace.trace.reader import ring_info

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "device"


def keep(run_dir: Path, name: str, extra: list[Path]) -> Path:
    dest = FIXTURES / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for path in sorted(run_dir.iterdir()):
        if path.suffix != ".ring":
            shutil.copy(path, dest / path.name)
            continue
        info = ring_info(str(path))
        if info is None:
            shutil.copy(path, dest / path.name)
            continue
        if info.first != 0:
            raise SystemExit(f"{path}: the ring wrapped; keep it whole")
        n = info.last + 1
        data = bytearray(path.read_bytes()[: schema.RING_HEADER_SIZE + n * schema.SLOT_SIZE])
        magic, version, slot_size, _capacity, head = schema.RING_HEADER.unpack_from(data)
        schema.RING_HEADER.pack_into(data, 0, magic, version, slot_size, max(n, 1), head)
        (dest / path.name).write_bytes(bytes(data))
    for path in extra:
        shutil.copy(path, dest / path.name)
    return dest


if __name__ == "__main__":
    print(keep(Path(sys.argv[1]), sys.argv[2], [Path(p) for p in sys.argv[3:]]))
