"""The implementation-level distinguisher: what do an output's bits say about the clean value it came from?

A mechanism that computes ``fl(v + z)`` (its noise z added to the clean value v in floating point) leaves v's
binary exponent in the result: which floats it can output, and how often, depend on v. That is the precision
attack (Mironov, CCS 2012; Jin et al., IEEE S&P 2022). On the gradient oracle's neighbouring pair "this output
is not reachable from D''s clean value" never fired on D''s outputs and fired on 7 % of D's: a delta of at
least 0.07 at any epsilon. A mechanism that adds its noise exactly (``shared.privacy.lattice``; OpenDP's
samplers) outputs values whose bits do not tell the clean values apart beyond what its guarantee allows, and
the audit checks that they do not.

The statistic is the likelihood ratio of an output's bits under the floating-point-addition model. With
noise z drawn with a smooth density f, the probability of the float output y given v is about
``f(y - v) w(y, v)``, where ``w(y, v)`` is the total width of the floats z with ``fl(v + z) = y``
(round to nearest):

* when z's spacing near ``y - v`` is finer than y's, many z land on y: w = ulp(y) (the rounding interval);
* otherwise at most a few floats z near ``fl(y - v)`` can (checked one by one, with their neighbours): w is
  the sum of their spacings, and 0 when none does (y is unreachable from v).

The score of an output is ``sum over its entries of log2 w(y, v') - log2 w(y, v)`` (v, v' the clean values on
D and D'): +inf when it cannot have come from D, -inf when it cannot have come from D' (clipped to +-1e6).
Plain reachability is the special case w > 0; the weights also catch a float sum at a subsampled round, where
"the agent was not sampled" makes every output reachable (pure noise) but a sampled one leaves outputs on
v's coarser grid far more often than noise alone would.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shared.privacy.rows import FloatArray

__all__ = ["preimage_log2_width", "precision_score", "reachable"]

_NEIGHBOURS = 2
_CLIP = 1e6


def preimage_log2_width(y: npt.ArrayLike, v: npt.ArrayLike) -> FloatArray:
    """Element-wise log2 of the width w(y, v) of the floats z with ``fl(v + z) == y`` (-inf: none)."""
    out_y = np.asarray(y, dtype=np.float64)
    clean = np.broadcast_to(np.asarray(v, dtype=np.float64), out_y.shape)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        z0 = out_y - clean
        ulp_y = np.spacing(np.abs(out_y))
        dense = np.spacing(np.abs(z0)) < ulp_y
        width = np.where(clean + z0 == out_y, np.spacing(np.abs(z0)), 0.0)
        up, down = z0, z0
        for _ in range(_NEIGHBOURS):
            up = np.nextafter(up, np.inf)
            down = np.nextafter(down, -np.inf)
            width += np.where(clean + up == out_y, np.spacing(np.abs(up)), 0.0)
            width += np.where(clean + down == out_y, np.spacing(np.abs(down)), 0.0)
        width = np.where(dense, ulp_y, width)
        result: FloatArray = np.log2(width)
    return result


def reachable(y: npt.ArrayLike, v: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Element-wise: is there a float64 z with ``fl(v + z) == y`` (round to nearest)?"""
    result: npt.NDArray[np.bool_] = np.isfinite(preimage_log2_width(y, v))
    return result


def precision_score(
    outputs: npt.ArrayLike, clean: npt.ArrayLike, clean_neighbour: npt.ArrayLike
) -> FloatArray:
    """Per output (first axis: trials; the rest: the entries): the log2 likelihood ratio of its bits, D' over
    D, under floating-point addition (larger: looks like D')."""
    y = np.asarray(outputs, dtype=np.float64)
    trials = y.shape[0]
    flat = y.reshape(trials, -1)
    c = np.asarray(clean, dtype=np.float64).reshape(1, -1)
    c2 = np.asarray(clean_neighbour, dtype=np.float64).reshape(1, -1)
    with np.errstate(invalid="ignore"):
        per_entry = preimage_log2_width(flat, c2) - preimage_log2_width(flat, c)
    per_entry = np.nan_to_num(per_entry, nan=0.0, posinf=_CLIP, neginf=-_CLIP)  # both -inf: says nothing
    score: FloatArray = np.clip(per_entry.sum(axis=1), -_CLIP, _CLIP)
    return score
