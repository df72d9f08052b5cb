"""Public request and response bodies of the pobo HTTP API (the curator part).

Both the curator service and its clients (the modeler's ``shared.protocol.client``) import these, so they are
pure pydantic: this package never imports FastAPI or SQLAlchemy. Field names are part of the HTTP
contract (docs/api.md); fields only ever get added.

Privacy split: ``ReleasePublic`` is what a partner (the modeler) may see; ``ReleaseDetail`` adds the
curator-private diagnostics (``sigma_min``, ``lifted``, the scaling) and is only served to the curator's
admin. One module per seam: ``common`` (types, bounds, scaling), ``budget`` (populations, ledger, privacy
report), ``datasets``, ``releases``, ``access`` (partners, queries, health, access log),
``gradients`` (DP-GIBO oracles).
"""

from __future__ import annotations

from shared.protocol.schemas.access import (
    AccessLogEntry,
    AccessLogPublic,
    GrantCreate,
    OutputPrivacy,
    OutputPrivacyPublic,
    PartnerCreate,
    PartnerCreated,
    PartnerPublic,
    PartnersPublic,
    QueriesPublic,
    QueryCreate,
    QueryLogVerification,
    QueryPublic,
    QueryResult,
)
from shared.protocol.schemas.budget import (
    FeatureProtection,
    GuaranteeAtChange,
    LedgerEntryPublic,
    LedgerPublic,
    OutputLedger,
    OutputRowTotal,
    PopulationBudget,
    PopulationPublic,
    PopulationsPublic,
    PrivacyReport,
    PrivacyRow,
    ReferenceColumn,
)
from shared.protocol.schemas.common import (
    DELTA_MIN,
    EPSILON_MAX,
    EPSILON_MIN,
    ID_MAX,
    LiftMode,
    Mechanism,
    ObjectiveMode,
    QueryStatus,
    Request,
    RowId,
    ScalingInfo,
    ScalingKind,
)
from shared.protocol.schemas.datasets import (
    DatasetPublic,
    DatasetsPublic,
)
from shared.protocol.schemas.gradients import (
    GradientKernel,
    GradientOracleCreate,
    GradientOraclePublic,
    GradientOraclesPublic,
    GradientStepCreate,
    GradientStepRecord,
    GradientStepResult,
    GradientStepsPublic,
)
from shared.protocol.schemas.releases import (
    NO_GUARANTEE_REASON,
    ReleaseCreate,
    ReleaseDetail,
    ReleasePublic,
    ReleaseRows,
    ReleasesPublic,
)
from shared.servicekit.health_schema import Health

__all__ = [
    "AccessLogEntry",
    "AccessLogPublic",
    "DELTA_MIN",
    "DatasetPublic",
    "DatasetsPublic",
    "EPSILON_MAX",
    "EPSILON_MIN",
    "FeatureProtection",
    "GradientKernel",
    "GradientOracleCreate",
    "GradientOraclePublic",
    "GradientOraclesPublic",
    "GradientStepCreate",
    "GradientStepRecord",
    "GradientStepResult",
    "GradientStepsPublic",
    "GrantCreate",
    "GuaranteeAtChange",
    "Health",
    "OutputPrivacy",
    "OutputPrivacyPublic",
    "ID_MAX",
    "LedgerEntryPublic",
    "LedgerPublic",
    "LiftMode",
    "Mechanism",
    "NO_GUARANTEE_REASON",
    "ObjectiveMode",
    "PartnerCreate",
    "PartnerCreated",
    "PartnerPublic",
    "PartnersPublic",
    "OutputLedger",
    "OutputRowTotal",
    "PopulationBudget",
    "PopulationPublic",
    "PopulationsPublic",
    "PrivacyReport",
    "PrivacyRow",
    "QueriesPublic",
    "QueryCreate",
    "QueryLogVerification",
    "QueryPublic",
    "QueryResult",
    "ReferenceColumn",
    "QueryStatus",
    "ReleaseCreate",
    "ReleaseDetail",
    "ReleasePublic",
    "ReleaseRows",
    "ReleasesPublic",
    "Request",
    "RowId",
    "ScalingInfo",
    "ScalingKind",
]
