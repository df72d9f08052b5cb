# The two-party loop of `pobo demo`, from a notebook, with the SDK alone (docs/sdk.md).
# The services' addresses and tokens come from the environment, as a notebook would read them.
import os

import pobo
from shared.tools.demo import DEMO_CSV  # the demo's synthetic cohort: 4000 patients, 7 features

CURATOR_URL, ADMIN_TOKEN = os.environ["POBO_CURATOR_URL"], os.environ["POBO_CURATOR_TOKEN"]
MODELER_URL, MODELER_TOKEN = os.environ["POBO_MODELER_URL"], os.environ["POBO_MODELER_TOKEN"]
FEATURES = [
    "age_years", "systolic_bp_mmhg", "cholesterol_mg_dl", "glucose_mg_dl",
    "triglycerides_mg_dl", "heart_rate_bpm", "creatinine_umol_l",
]  # fmt: skip
# One patient's change the release protects, in each feature's own units (the privacy unit).
SCALES = {"age_years": 0.4, "systolic_bp_mmhg": 0.4, "cholesterol_mg_dl": 1.0, "glucose_mg_dl": 0.6,
          "triglycerides_mg_dl": 1.0, "heart_rate_bpm": 0.3, "creatinine_umol_l": 0.5}  # fmt: skip

# --- at the hospital: the curator, with its admin token ---------------------------------------------
curator = pobo.Curator(CURATOR_URL, ADMIN_TOKEN)
dataset = curator.upload(
    DEMO_CSV, name="demo hospital", objective="recovery_score", features=FEATURES, scaling=SCALES
)
report = curator.privacy_report(dataset.id, epsilon=1.0, delta=1e-5, r_max=1)
print(f"a release at epsilon=1 adds noise of std {report.noise_std:.3g} in the declared units")
release = curator.release(dataset.id, epsilon=1.0, delta=1e-5)
partner = curator.create_partner(name="modeler lab", release_ids=[release.id], max_queries=30)

# --- at the modeler: a GP-UCB study over the released rows, with the partner token ------------------
modeler = pobo.Modeler(MODELER_URL, MODELER_TOKEN)
study = modeler.create_study(
    curator_url=CURATOR_URL,
    release_id=release.id,
    curator_token=partner.token,
    strategy="gp-ucb",
    iterations=20,
)
modeler.run(study.id)
study = modeler.wait(study.id, timeout=300)  # a progress bar in a terminal or notebook
best = modeler.best(study.id)
print(f"study {study.id}: {study.status}, best row {best.index} with recovery score {best.y:.2f}")

audit = modeler.audit(study.id)
assert modeler.verify_audit(study.id).ok  # the hash chain holds
try:
    frame = modeler.to_dataframe(study.id)  # one row per curator query
    print(frame[["iteration", "index", "y"]].tail())
except ImportError as exc:  # pandas is optional
    print(exc)

# --- back at the hospital: what was spent, and who asked what ---------------------------------------
ledger = curator.ledger(dataset.id)
print(f"epsilon spent {ledger.epsilon_spent:g} of {ledger.epsilon_budget:g}")
print(f"{curator.access_log().count} calls in the access log")
curator.close()
modeler.close()
