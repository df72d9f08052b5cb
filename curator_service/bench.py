"""Speed of the curator through its real HTTP API: CSV upload throughput and release time.

Run: ``python -m curator_service.bench --rows 1000000 --cols 50 --r 15``. Starts ``pobo curator serve`` on
a free port with a temporary data dir (SQLite), uploads a synthetic CSV with httpx (streamed from disk),
creates one release and downloads it, and prints the timings as JSON. A benchmark, not a test: the
synthetic data uses a fixed seed, which production code never does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from shared.processes import ServiceProcess, curator_env, free_port


def write_csv(path: Path, rows: int, cols: int, *, seed: int = 0, fmt: str = "%.10g") -> None:
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(",".join([f"x{j}" for j in range(cols)] + ["y"]) + "\n")
        step = 100_000
        for start in range(0, rows, step):
            k = min(step, rows - start)
            X = rng.normal(size=(k, cols))
            y = np.sin(X[:, 0]) + 0.1 * X[:, 1]
            np.savetxt(fh, np.column_stack([X, y]), delimiter=",", fmt=fmt)


def run(
    rows: int, cols: int, r: int, csv: Path | None = None, database_url: str | None = None
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="pobo-curator-bench-"))
    if csv is None:
        csv = work / "bench.csv"
        t0 = time.perf_counter()
        write_csv(csv, rows, cols)
        print(
            f"wrote {csv} ({csv.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
    token = "bench-admin-token-" + os.urandom(16).hex()
    server = ServiceProcess(
        "curator",
        port=free_port(),
        env=curator_env(work / "data", token, database_url),
        log_path=work / "server.log",
    )
    base = server.url
    headers = {"Authorization": f"Bearer {token}"}
    result: dict[str, Any] = {"rows": rows, "cols": cols, "r": r, "csv_bytes": csv.stat().st_size}
    with server:
        server.wait_healthy(timeout=60)
        with httpx.Client(base_url=base, headers=headers, timeout=3600) as client:
            t0 = time.perf_counter()
            with open(csv, "rb") as fh:
                up = client.post(
                    "/v1/datasets",
                    files={"file": ("bench.csv", fh, "text/csv")},
                    data={"name": "bench", "objective": "y"},
                )
            upload_s = time.perf_counter() - t0
            up.raise_for_status()
            ds = up.json()["id"]
            result |= {
                "upload_seconds": round(upload_s, 2),
                "upload_rows_per_second": round(rows / upload_s),
                "upload_mb_per_second": round(result["csv_bytes"] / 1e6 / upload_s, 1),
            }
            t0 = time.perf_counter()
            health_during: list[float] = []
            with httpx.Client(base_url=base, timeout=60) as probe:
                import threading

                done = threading.Event()

                def poll() -> None:
                    while not done.is_set():
                        t = time.perf_counter()
                        probe.get("/healthz")
                        health_during.append(time.perf_counter() - t)
                        time.sleep(0.2)

                thread = threading.Thread(target=poll)
                thread.start()
                # the default Gaussian release, projected to r < cols; delta well below 1/n
                body = {"epsilon": 1.0, "delta": min(1e-5, 0.1 / rows), "r": r if r < cols else None}
                rel = client.post(f"/v1/datasets/{ds}/releases", json=body)
                done.set()
                thread.join()
            release_s = time.perf_counter() - t0
            rel.raise_for_status()
            result |= {
                "release_seconds": round(release_s, 2),
                "healthz_max_latency_during_release_ms": round(1000 * max(health_during or [0.0]), 1),
            }
            t0 = time.perf_counter()
            privacy = client.get(f"/v1/datasets/{ds}/privacy", params={"epsilon": 1.0, "delta": 1e-5})
            privacy.raise_for_status()
            result["privacy_report_seconds_cached"] = round(time.perf_counter() - t0, 3)
            t0 = time.perf_counter()
            npy = client.get(f"/v1/releases/{rel.json()['id']}/rows", headers={"Accept": "application/x-npy"})
            npy.raise_for_status()
            result["download_npy_seconds"] = round(time.perf_counter() - t0, 2)
            result["download_npy_bytes"] = len(npy.content)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cols", type=int, default=50)
    parser.add_argument("--r", type=int, default=15)
    parser.add_argument("--csv", type=Path, default=None, help="Use this CSV (last column = outcome 'y').")
    parser.add_argument("--database-url", default=None, help="Default: SQLite in the temporary data dir.")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.rows, args.cols, args.r, args.csv, args.database_url), indent=2))


if __name__ == "__main__":  # pragma: no cover
    main()
