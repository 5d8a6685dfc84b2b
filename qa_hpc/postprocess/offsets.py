"""Character offsets of every eval feature's tokens, read from an Arrow list<list<int>> column.

run_qa.py hands over the features' own Arrow column, so the ~2 million offsets of a dev set are
never turned into Python objects; other inputs (Python lists) go through pa.array once, so there
is one way to read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass
class FlatOffsets:
    """Offsets of all features laid end to end, read only where a candidate needs them.

    Feature f owns flat positions row_start[f] .. row_start[f] + length[f] - 1. Token i is a context
    token when valid[i]; its offsets are then values[pair_at[i]] and values[pair_at[i] + 1]. These are
    the Arrow column's own buffers (no copy of the offsets).
    """

    row_start: np.ndarray  # int64 [F]
    length: np.ndarray  # int64 [F]
    valid: np.ndarray  # bool [T]
    pair_at: np.ndarray  # int [T]; meaningful where valid
    values: np.ndarray  # int64, start/end character offsets

    def context_tokens(self, token: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(is a context token, flat index) of token positions `token` [F, k], row f being feature f.

        A position past its feature's length is no context token; it is pointed at the feature's
        row_start, at most T, where an added False entry answers without a bounds check.
        """
        inside = token < self.length[:, None]
        flat = self.row_start[:, None] + np.where(inside, token, 0)
        return inside & np.append(self.valid, False)[flat], flat

    def start_at(self, flat: np.ndarray) -> np.ndarray:
        """Start character of each (context) flat token index."""
        return self.values[self.pair_at[flat]].astype(np.int64)

    def end_at(self, flat: np.ndarray) -> np.ndarray:
        return self.values[self.pair_at[flat] + 1].astype(np.int64)


def flat_offsets(offset_mapping: Any) -> FlatOffsets:
    """FlatOffsets of a pyarrow (Chunked)Array of list<list<int>> (None outside the context), or of Python lists."""
    arr = offset_mapping if isinstance(offset_mapping, (pa.Array, pa.ChunkedArray)) else pa.array(offset_mapping)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not (pa.types.is_list(arr.type) and pa.types.is_list(arr.type.value_type)):
        arr = arr.cast(pa.list_(pa.list_(pa.int64())))  # e.g. list<null> when a column holds no offsets at all
    length = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    tokens = arr.flatten()  # one entry per token, null outside the context; honours slices of arr
    pair_len = pc.min_max(pc.list_value_length(tokens))  # nulls (non-context tokens) skipped
    if pair_len["min"].as_py() not in (None, 2) or pair_len["max"].as_py() not in (None, 2):
        raise ValueError("offset_mapping entries must be [start, end] pairs or null")
    if tokens.values.null_count:
        raise ValueError("offset_mapping pairs must not hold nulls")
    values = tokens.values.to_numpy(zero_copy_only=False)
    valid = tokens.is_valid().to_numpy(zero_copy_only=False)
    pair_at = tokens.offsets.to_numpy()[:-1]  # where each token's pair sits in tokens.values
    row_start = np.zeros(len(length), dtype=np.int64)
    np.cumsum(length[:-1], out=row_start[1:])
    return FlatOffsets(row_start, length, valid, pair_at, values)
