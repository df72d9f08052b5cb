"""The Gaussian release on Dask (``shared.distributed.release``) is the local release, bit for bit.

One local cluster of 2 worker processes for the module (``connect(None)``: TLS with in-memory certificates),
closed at the end. The same master generator (``seeded_rng``) gives the same Z on the cluster as in this
process, whatever X's chunks, and after a worker is killed while the blocks run (Dask recomputes its tasks:
each block is a pure function of its rows and its keys).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np
import pytest

pytest.importorskip("distributed")

import dask.array as da  # noqa: E402

from shared.distributed.release import gaussian_release_dask  # noqa: E402
from shared.errors import InputDataError  # noqa: E402
from shared.privacy.gaussian import gaussian_release, noise_blocks  # noqa: E402
from shared.privacy.rng import seeded_rng  # noqa: E402

N, D, R = 50_000, 20, 5
EPS, DELTA = 1.0, 1e-6
SEED = 0x5EED_0F_0B0


@pytest.fixture
def client(dask_client: Any) -> Any:
    """The session's local cluster (tests/conftest.py)."""
    return dask_client


@pytest.fixture(scope="module")
def X() -> np.ndarray:
    return np.random.default_rng(11).normal(loc=2.0, scale=3.0, size=(N, D))


@pytest.fixture(scope="module")
def local(X: np.ndarray) -> dict[int | None, np.ndarray]:
    return {r: gaussian_release(X, epsilon=EPS, delta=DELTA, r=r, rng=seeded_rng(SEED)).Z for r in (None, R)}


def test_the_blocks_are_many_and_do_not_depend_on_chunks() -> None:
    blocks = noise_blocks(N, D)
    assert len(blocks) > 4  # the cluster gets work to share; the test below crosses block boundaries
    assert noise_blocks(N, D) == blocks


@pytest.mark.parametrize("r", [None, R])
def test_dask_release_is_the_local_release_bit_for_bit(
    client: Any, X: np.ndarray, local: dict[int | None, np.ndarray], r: int | None
) -> None:
    rel = gaussian_release_dask(X, epsilon=EPS, delta=DELTA, r=r, rng=seeded_rng(SEED), client=client)
    assert rel.Z.shape == (N, D if r is None else r) and rel.projected == (r is not None)
    assert np.array_equal(rel.Z, local[r])
    # another master key: other noise (the keys reach the tasks)
    other = gaussian_release_dask(X, epsilon=EPS, delta=DELTA, r=r, rng=seeded_rng(SEED + 1), client=client)
    assert not np.array_equal(other.Z, local[r])


@pytest.mark.parametrize("chunks", [7_000, 50_000, 1_234])
def test_the_dask_chunking_of_X_does_not_change_Z(
    client: Any, X: np.ndarray, local: dict[int | None, np.ndarray], chunks: int
) -> None:
    Xd = da.from_array(X, chunks=(chunks, D))
    rel = gaussian_release_dask(Xd, epsilon=EPS, delta=DELTA, rng=seeded_rng(SEED), client=client)
    assert np.array_equal(rel.Z, local[None])


def slow_rows(block: np.ndarray) -> np.ndarray:
    """X's chunks, made slowly on the workers (so a worker can be killed while the release runs)."""
    time.sleep(0.25)
    return block


async def die() -> None:
    """Run on a worker: its process exits at once (no clean-up; the nanny starts a new one)."""
    os._exit(1)


def test_a_worker_killed_mid_release_changes_nothing(
    client: Any, X: np.ndarray, local: dict[int | None, np.ndarray]
) -> None:
    Xd = da.from_array(X, chunks=(noise_blocks(N, D).step, D)).map_blocks(slow_rows, dtype=X.dtype)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["Z"] = gaussian_release_dask(
                Xd, epsilon=EPS, delta=DELTA, rng=seeded_rng(SEED), client=client
            ).Z
        except BaseException as exc:  # pragma: no cover - reported below
            result["error"] = exc

    before = set(client.scheduler_info()["workers"])
    victim = sorted(before)[0]
    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # wait until the victim is busy with a block
        processing = client.processing(workers=[victim]).get(victim, ())
        if processing:
            break
        time.sleep(0.02)
    assert processing, "the victim never got a task"
    client.run(die, workers=[victim], wait=False)  # the process dies mid-task; its nanny restarts it
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert "error" not in result, result.get("error")
    assert np.array_equal(result["Z"], local[None])
    deadline = time.monotonic() + 30
    while victim in client.scheduler_info()["workers"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert victim not in client.scheduler_info()["workers"]  # it did die
    client.wait_for_workers(2, timeout=60)  # the nanny's new process, for the tests after this one


def test_bad_rows_are_refused_by_position_from_the_cluster(client: Any, X: np.ndarray) -> None:
    bad = X.copy()
    bad[45_001, 3] = np.inf
    with pytest.raises(InputDataError, match="row 45001, column 3 is NaN or infinite"):
        gaussian_release_dask(bad, epsilon=EPS, delta=DELTA, rng=seeded_rng(SEED), client=client)
    with pytest.raises(InputDataError, match="row 45001, column 3 is NaN or infinite"):
        gaussian_release_dask(
            da.from_array(bad, chunks=(9_000, D)),
            epsilon=EPS,
            delta=DELTA,
            rng=seeded_rng(SEED),
            client=client,
        )
