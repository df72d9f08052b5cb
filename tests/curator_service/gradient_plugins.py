"""Plug-in losses for the gradient-oracle tests (named in POBO_CURATOR_GRADIENT_LOSSES by dotted path)."""

from __future__ import annotations

import numpy as np


def squared_distance(theta_batch: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Row-independent: 0.5 ||x_j - theta_k||^2 over the feature columns (the last column is the outcome)."""
    X = rows[:, :-1]
    diff = X[:, None, :] - theta_batch[None, :, :]
    return 0.5 * np.einsum("mbd,mbd->mb", diff, diff)


def centred_distance(theta_batch: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """NOT row-independent: centres the rows by their mean first (every row moves with any other)."""
    X = rows[:, :-1] - rows[:, :-1].mean(axis=0)
    diff = X[:, None, :] - theta_batch[None, :, :]
    return 0.5 * np.einsum("mbd,mbd->mb", diff, diff)


def fragile(theta_batch: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Row-independent, but raises whenever one of its rows has a first feature above 100."""
    if (rows[:, 0] > 100).any():
        raise ValueError(f"cannot handle {rows[:, 0].max()}")  # the message quotes data: must not leak
    return squared_distance(theta_batch, rows)
