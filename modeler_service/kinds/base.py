"""The interface of a request kind: everything the modeler does with one kind of request to a curator.

A strategy plans requests of the kinds it declares (``Strategy.kinds``; each request object carries its
``kind`` name). The modeler never looks inside a request: it asks the request's kind, registered in
``modeler_service.kinds``, to

* set up a study on what the kind runs on (``create``: a release and its Z, a gradient oracle's public
  parameters) and load it again after a restart (``load_inputs``);
* write a planned request ahead into the round's intent (``plan``), send it with its Idempotency-Key
  (``send``) and, while the curator has not answered it yet, wait for it (``is_complete``, ``wait``);
* decode the curator's answer into what the strategy observes (``answer``, the one decoder) and into the
  audit entry recorded for it (``record``), and the audit entry back into the answer (``from_record``) when
  a strategy is rebuilt;
* show a request and its answer (``public``), a study's best point and target (``best``, ``public_fields``,
  ``target_label``) and its progress chart (``chart``).

Built-in kinds: ``row`` (``kinds/row.py``) and ``gradient`` (``kinds/gradient.py``). CONTRIBUTING.md says how
to add one; ``tests/modeler_service/test_kinds.py`` adds a toy kind and strategy without touching the
modeler.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session

from modeler_service.config import Settings
from modeler_service.models import Study
from modeler_service.schemas import BestPoint, RoundQuery, StudyCreate
from modeler_service.upstream import ClientFactory
from shared.bo.strategies import Strategy, StrategyParams
from shared.protocol.client import CuratorClient, CuratorError

if TYPE_CHECKING:
    from matplotlib.axes import Axes


class Services(Protocol):
    """What a kind needs of the modeler's context to set up a study."""

    @property
    def settings(self) -> Settings: ...

    @property
    def client_factory(self) -> ClientFactory: ...

    @property
    def data_dir(self) -> Path: ...

    def encrypt(self, token: str) -> str: ...


@dataclass(frozen=True)
class PlannedRequest:
    """One request of the round in flight, as written ahead: what to ask, why, with which key.

    ``kind`` names the request kind that sends, decodes and shows it; ``index`` is the row it asks for
    (row-like kinds), ``body`` what it sends (kinds whose request has a body, re-sent as is after a crash),
    ``query_id`` the curator's id for it once known (an answer still awaited)."""

    request: int
    kind: str
    index: int | None
    details: dict[str, Any]
    key: str
    query_id: int | None = None
    body: dict[str, Any] | None = None


@dataclass(frozen=True)
class Recorded:
    """What the audit entry of an answered request holds besides its place in the chain."""

    index: int | None
    y: float | None
    curator_query_id: int
    details: dict[str, Any]


class RequestKind(ABC):
    """One kind of request to the curator. Subclasses set ``name`` and ``runs_on`` (the ``Strategy.runs_on``
    of the strategies that issue it, which names the study's target field ``<runs_on>_id``)."""

    name: ClassVar[str]
    runs_on: ClassVar[str]

    # ------------------------------------------------------------------------------------- the study

    @abstractmethod
    def create(
        self,
        session: Session,
        services: Services,
        body: StudyCreate,
        strategy: type[Strategy[Any, Any]],
        params: StrategyParams,
    ) -> Study:
        """Set up a new study of ``strategy`` on what this kind runs on and add it to ``session``."""

    @abstractmethod
    def load_inputs(self, data_dir: Path, study: Study) -> Any:
        """The strategy's first argument (Z, a domain, ...) for ``study``, as stored when it was created."""

    @abstractmethod
    def target_id(self, study: Study) -> int | None:
        """The id of what the study runs on (its release, its gradient oracle)."""

    @abstractmethod
    def budget_left(self, client: CuratorClient, study: Study) -> tuple[int, str]:
        """How many more requests the curator's grant allows the study's target, and what that number is
        (for a message: "queries left of this partner token's quota (...)"); checks the token too."""

    def target_label(self, study: Study) -> str:
        """What the study runs on, for people (``release 3``)."""
        return f"{self.runs_on.replace('-', ' ')} {self.target_id(study)}"

    def best(self, study: Study) -> BestPoint | None:
        """The study's best point so far (default: the best row and its outcome)."""
        if study.best_index is not None and study.best_y is not None:
            return BestPoint(index=study.best_index, y=study.best_y)
        return None

    def public_fields(self, study: Study) -> dict[str, Any]:
        """The fields of ``StudyPublic`` this kind fills (what the study runs on, in detail)."""
        return {}

    def chart(self, session: Session, study: Study) -> Any | None:
        """The study's progress as chart data for the console, or None for the default (best so far)."""
        return None

    def plot(self, ax: Axes, session: Session, study: Study) -> bool:
        """Draw the study's progress on ``ax`` for ``plot.png``; False: the default plot (best so far)."""
        return False

    # ------------------------------------------------------------------------------------- a request

    @abstractmethod
    def plan(
        self, study: StudyFacts, request: Any, position: int, details: dict[str, Any], key: str
    ) -> PlannedRequest:
        """The strategy's ``request`` written ahead (checked against the study: raise ``StrategyError``)."""

    @abstractmethod
    def send(self, client: CuratorClient, study: Study, request: PlannedRequest, what: str) -> Any:
        """Send (or re-send, with the same key) ``request`` to the curator; its answer, possibly pending."""

    def is_complete(self, answer: Any) -> bool:
        """Whether ``answer`` is final (default: answered at once)."""
        return True

    def wait(self, client: CuratorClient, answer: Any, seconds: float) -> Any:
        """Long-poll the curator once for a pending ``answer``; the answer as it stands."""
        return answer

    def query_id(self, answer: Any) -> int | None:
        """The curator's id of a pending answer, kept in the intent while it is awaited."""
        return None

    def refused_for_good(self, error: CuratorError) -> bool:
        """Whether the curator's ``error`` refuses ``request``'s target for good while nothing was charged
        (the strategy must then stop choosing it: ``exclusions``). Default: no such refusal."""
        return False

    def exclusions(
        self, client: CuratorClient, study: Study, refused: PlannedRequest
    ) -> npt.NDArray[np.bool_] | None:
        """After ``refused`` was refused for good: what the curator will no longer answer under the study's
        grant, ``refused``'s target included, as a mask over the study's candidates
        (``Strategy.exclude_rows``); None: nothing to exclude (the default)."""
        return None

    @abstractmethod
    def answer(self, request: PlannedRequest, answer: Any) -> Any:
        """The curator's ``answer`` as the strategy observes it (the one decoder)."""

    @abstractmethod
    def record(self, request: PlannedRequest, answer: Any, extra: Mapping[str, Any]) -> Recorded:
        """The audit entry of an answered request (``extra``: the strategy's outcome numbers for it)."""

    @abstractmethod
    def from_record(self, index: int | None, y: float | None, details: Mapping[str, Any]) -> Any:
        """An audit entry back into the answer the strategy observed (rebuilding it after a restart)."""

    @abstractmethod
    def public(self, request: PlannedRequest, answer: Any | None) -> RoundQuery:
        """A request of a round and its answer so far (None: not sent or not answered yet)."""


@dataclass(frozen=True)
class StudyFacts:
    """The attributes of a study that never change after it is created and that planning a round reads
    (copied out of the row, so they stay readable whatever happens to the session that loaded it);
    ``target_id``: the id of what it runs on (``RequestKind.target_id``)."""

    id: str
    strategy: str
    seed: int | None
    n: int
    target_id: int | None
    iterations_total: int
