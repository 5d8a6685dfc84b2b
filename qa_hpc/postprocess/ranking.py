"""Per-row top-k and per-group minimum with exactly the reference loop's choices among equal values."""

from __future__ import annotations

import numpy as np
import torch


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing the array's memory; read-only or strided arrays are copied first (torch wants neither)."""
    return torch.from_numpy(np.require(array, requirements=["C", "W"]))


def top_k_with_values(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, `np.argsort(row)[-1:-k-1:-1]` (the loop's ranking) and the logits at those indices.

    torch.topk finds the k + 1 largest of every row at once, on every core. Rows whose k + 1 largest
    hold no equal values and no NaN have exactly one ranking, which topk found. In any other row the
    order among equal values is np.argsort's implementation detail, so those rows (common with bf16
    logits, or short rows padded with -100) are ranked by the very same np.argsort call.
    """
    n, width = logits.shape
    k = min(k, width)
    if n == 0 or width == 0:
        return np.zeros((n, k), dtype=np.int64), np.zeros((n, k), dtype=logits.dtype)
    keep = min(k + 1, width)  # the (k+1)-th value decides whether the k-th is unique
    ranked_vals, ranked = (t.numpy() for t in torch.topk(as_tensor(logits), keep, dim=1, sorted=True))
    ambiguous = np.any(ranked_vals[:, :-1] == ranked_vals[:, 1:], axis=1) | np.isnan(ranked_vals).any(axis=1)
    indices, values = ranked[:, :k].copy(), ranked_vals[:, :k].copy()
    for row in np.flatnonzero(ambiguous).tolist():
        indices[row] = np.argsort(logits[row])[-1 : -k - 1 : -1]
        values[row] = logits[row, indices[row]]
    return indices, values


def kth_largest(rows: np.ndarray, k: int) -> np.ndarray:
    """The k-th largest value of every row (a value, not an index: ties do not matter)."""
    return torch.topk(as_tensor(rows), k, dim=1, sorted=True).values[:, -1].numpy()


def first_minimum(values: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group, the loop's `if first or v < best: best = v` over its values in order (inf where none).

    Not just np.minimum.at: among equal values the loop keeps the first (0.0 and -0.0 are equal but
    are written differently), and a NaN is kept only when it comes first (nothing is < NaN, NaN < x is False).
    """
    mins = np.full(n_groups, np.inf)
    if not len(values):
        return mins
    np.fmin.at(mins, group, values)  # fmin: NaN never wins
    hits = np.flatnonzero(values == mins[group])
    _, first_hit = np.unique(group[hits], return_index=True)  # hits are in order: the first per group
    mins[group[hits[first_hit]]] = values[hits[first_hit]]
    _, first_of_group = np.unique(group, return_index=True)
    nan_first = np.isnan(values[first_of_group])
    mins[group[first_of_group[nan_first]]] = np.nan
    return mins
