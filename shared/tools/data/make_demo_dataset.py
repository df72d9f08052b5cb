"""Generate ``demo_hospital.csv``: a clearly SYNTHETIC "hospital" dataset for ``pobo demo``.

Every row is invented by this script from a fixed seed (no real person, no download). Run it again and you
get the same bytes::

    python -m shared.tools.data.make_demo_dataset            # rewrites shared/tools/data/demo_hospital.csv

Columns: ``patient`` (a synthetic id), seven numeric features in clinical units, and the hidden outcome
``recovery_score`` (0-100, higher is better). The score is a smooth function of the features that peaks
for a rare combination (older, low blood pressure, low glucose, ...), plus a little noise, so a good
optimiser finds a near-best patient profile in a few dozen queries where random choice does not.

``DP_UNITS`` are the per-feature scales the demo curator declares at upload: neighbouring datasets differ
in one patient by at most 1 in the scaled units, i.e. by up to 0.4 years of age, 0.4 mmHg, 1 mg/dL of
cholesterol, ... (declared, data-independent scales keep the formal (epsilon, delta) guarantee).

The curator keeps the outcome apart and never releases it; the demo knows it only because it made the file.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

SEED = 20200712  # ICML 2020
N_PATIENTS = 4000
FEATURES = [
    "age_years",
    "systolic_bp_mmhg",
    "cholesterol_mg_dl",
    "glucose_mg_dl",
    "triglycerides_mg_dl",
    "heart_rate_bpm",
    "creatinine_umol_l",
]
OUTCOME = "recovery_score"
DP_UNITS = {
    "age_years": 0.4,
    "systolic_bp_mmhg": 0.4,
    "cholesterol_mg_dl": 1.0,
    "glucose_mg_dl": 0.6,
    "triglycerides_mg_dl": 1.0,
    "heart_rate_bpm": 0.3,
    "creatinine_umol_l": 0.5,
}
PATH = Path(__file__).with_name("demo_hospital.csv")


def generate(n: int = N_PATIENTS, seed: int = SEED) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(ids, X [n, 7] in clinical units, outcome [n]) — deterministic for a given seed."""
    rng = np.random.default_rng(seed)
    age = np.clip(rng.normal(58, 16, n), 18, 95)
    sbp = 118 + 0.45 * (age - 58) + rng.normal(0, 17, n)
    chol = rng.normal(200, 40, n) + 0.3 * (age - 58)
    glucose = rng.normal(104, 24, n) + 0.2 * (sbp - 118)
    trig = rng.normal(150, 45, n) + 0.4 * (glucose - 104)
    hr = rng.normal(72, 13, n) - 0.1 * (age - 58)
    creat = rng.normal(84, 22, n) + 0.25 * (age - 58)
    X = np.column_stack([age, sbp, chol, glucose, trig, hr, creat])
    # Hidden outcome: a broad hill (in units of each feature's spread) whose top lies just beyond the edge
    # of the data, at a rare profile: older, low blood pressure, low cholesterol and glucose, higher heart
    # rate, lower creatinine. Plus a little measurement noise.
    W = (X - X.mean(axis=0)) / X.std(axis=0)
    top = np.array([1.5, -1.5, -1.0, -1.5, 0.0, 1.5, -1.0])
    score = 20.0 + 75.0 * np.exp(-0.5 * ((W - top) ** 2).sum(axis=1) / 9.0) + rng.normal(0, 0.3, n)
    ids = [f"SYN-{i:05d}" for i in range(1, n + 1)]
    return ids, np.round(X, 1), np.round(np.clip(score, 0, 100), 2)


def write(path: Path = PATH) -> Path:
    ids, X, y = generate()
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(["patient", *FEATURES, OUTCOME])
        for pid, row, value in zip(ids, X, y, strict=True):
            w.writerow([pid, *(f"{v:.1f}" for v in row), f"{value:.2f}"])
    return path


if __name__ == "__main__":
    out = write()
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
