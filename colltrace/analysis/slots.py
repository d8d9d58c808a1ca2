"""The ring's slots as numpy columns: a record type over the raw slot bytes, offsets from the schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from colltrace.trace import schema

_NUMPY = {"Q": "<u8", "q": "<i8", "I": "<u4", "i": "<i4", "H": "<u2", "B": "u1"}
_CODES = dict(schema.SLOT_FIELDS)


def columns(*fields: str) -> np.dtype[Any]:
    """A numpy record type over one whole slot that reads only `fields` (schema names)."""
    return np.dtype({
        "names": list(fields),
        "formats": [_NUMPY[_CODES[f]] for f in fields],
        "offsets": [schema.field_offset(f) for f in fields],
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
