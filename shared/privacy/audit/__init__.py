"""The empirical privacy audit: every mechanism pobo ships, attacked on a fixed pair of neighbouring datasets.

A proof can be wrong and code can differ from its proof. For each mechanism the audit runs the production
implementation many times on D and on D', applies two distinguishers (the likelihood-ratio test, which
measures how far apart the output distributions are; the precision test, which asks whether an output's bits
could have come from each dataset's clean value at all), and turns their error rates into lower bounds
(``stats``) on the level of the mechanism's claim (mu for a Gaussian mechanism, epsilon for a pure one) and on
epsilon. Each mechanism with a guarantee comes with two controls, the same mechanism with a planted error
(noise calibrated for a 1.5x smaller sensitivity; noise added in floating point), which the audit must
catch: that is what shows it has teeth.

Modules: ``stats`` (bounds), ``precision`` (the reachability test), ``core`` (mechanisms, runs, verdicts),
``builders`` (the four rows of an exact-Gaussian mechanism), ``mechanisms`` (the release, CTL, Algorithm 1).
The DP-GIBO oracle (``shared.bo.gibo.audit``) and the federation round (``shared.federated.audit``) keep their
own registries, which ``pobo audit privacy`` merges (``shared.privacy`` may import neither).
"""

from shared.privacy.audit.builders import LR_TEST, PRECISION_TEST, exact_gaussian_audits, projection_statistic
from shared.privacy.audit.core import (
    ALPHA,
    FLOAT_ADDITION,
    SENSITIVITY_X15,
    AuditResult,
    Mechanism,
    Registry,
    Test,
    audit_rng,
    choose_threshold,
    run_all,
    run_audit,
    run_test,
)
from shared.privacy.audit.mechanisms import (
    AUDITS,
    ctl_audits,
    gaussian_audits,
    neighbouring_pair,
    po_gp_ucb_mechanism,
)
from shared.privacy.audit.precision import precision_score, reachable
from shared.privacy.audit.stats import (
    Claim,
    clopper_pearson_upper,
    epsilon_lower_bound,
    gdp_mu_lower_bound,
    subsampled_gaussian_delta,
)

__all__ = [
    "ALPHA",
    "AUDITS",
    "FLOAT_ADDITION",
    "LR_TEST",
    "PRECISION_TEST",
    "SENSITIVITY_X15",
    "AuditResult",
    "Claim",
    "Mechanism",
    "Registry",
    "Test",
    "audit_rng",
    "choose_threshold",
    "clopper_pearson_upper",
    "ctl_audits",
    "epsilon_lower_bound",
    "exact_gaussian_audits",
    "gaussian_audits",
    "gdp_mu_lower_bound",
    "neighbouring_pair",
    "po_gp_ucb_mechanism",
    "precision_score",
    "projection_statistic",
    "reachable",
    "run_all",
    "run_audit",
    "run_test",
    "subsampled_gaussian_delta",
]
