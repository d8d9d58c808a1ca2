"""The ring's slots as numpy columns: a record type over the raw slot bytes, offsets from the schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from colltrace.trace import schema

_NUMPY = {"Q": "<u8", "q": "<i8", "I": "<u4", "i": "<i4", "H": "<u2", "B": "u1"}
_CODES = dict(schema.SLOT_FIELDS)


def columns(*fields: str, words: dict[str, tuple[str, str]] | None = None) -> np.dtype[Any]:
    """A numpy record type over one whole slot that reads only `fields` (schema names), and for each
    name in `words` the consecutive fields first..last as one row of 32-bit words (a hashable key)."""
    runs = words or {}
    sizes = {name: schema.run_struct(*run).size for name, run in runs.items()}
    assert all(size % 4 == 0 for size in sizes.values()), sizes
    return np.dtype({
        "names": [*fields, *runs],
        "formats": [_NUMPY[_CODES[f]] for f in fields] + [("<u4", (sizes[name] // 4,)) for name in runs],
        "offsets": [schema.field_offset(f) for f in fields] + [schema.field_offset(first) for first, _ in runs.values()],
        "itemsize": schema.SLOT_SIZE,
    })  # fmt: skip


def good(chunks: Iterator[tuple[int, bytes]], dtype: np.dtype[Any]) -> Iterator[tuple[Any, Any]]:
    """(idxs, columns) of each block's readable slots (marker == idx + 1: not torn, not stale).
    `dtype` must read the marker."""
    for idx0, chunk in chunks:
        n = len(chunk) // schema.SLOT_SIZE
        if not n:
            continue
        cols = np.frombuffer(chunk, dtype=dtype, count=n)
        idxs = np.arange(idx0, idx0 + n, dtype=np.int64)
        ok = cols["marker"] == (idxs + 1).astype(np.uint64)
        if not ok.all():
            cols, idxs = cols[ok], idxs[ok]
        if len(idxs):
            yield idxs, cols
