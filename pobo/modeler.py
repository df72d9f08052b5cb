"""``pobo.Modeler``: the modeler's calls (modeler token), on :class:`shared.protocol.client.ModelerClient`."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from pobo._service import Service
from pobo._tables import require_pandas
from shared.protocol.client import ModelerClient
from shared.protocol.schemas import AgentCreated, FederationPublic, FederationsPublic
from shared.protocol.schemas.studies import (
    AuditLog,
    AuditVerification,
    BestPoint,
    RunAccepted,
    StepResult,
    StrategiesPublic,
    StudiesPublic,
    StudyPublic,
)

__all__ = ["ACTIVE", "Modeler"]

#: The statuses of a study whose run is still going (``wait`` waits through them).
ACTIVE = frozenset({"running", "awaiting_measurement", "waiting_for_curator"})


class Modeler(Service[ModelerClient]):
    """The modeler service: studies over a curator's release (create, run, wait, best, audit) and the
    federations.

    ``Modeler(url, token)`` with the modeler token; ``**client_options`` go to ``ModelerClient``
    (``timeout``, ``retries``, ``verify``). Use it as a context manager or call :meth:`close`. Answers are
    the API's models; errors are :class:`pobo.ModelerApiError` (``status_code``, ``detail``: the API's
    message; a curator's refusal relayed by the modeler keeps the curator's words). The underlying client
    is :attr:`client`.
    """

    _label = "pobo.Modeler"

    def __init__(self, url: str, token: str, **client_options: Any) -> None:
        super().__init__(ModelerClient(url, token, **client_options), url)

    # -- studies ---------------------------------------------------------------------------------------
    def strategies(self) -> StrategiesPublic:
        """The strategies a study can run, each with the JSON schema of its parameters."""
        return self.client.list_strategies()

    def create_study(
        self,
        *,
        curator_url: str,
        release_id: int | None = None,
        curator_token: str,
        strategy: str = "gp-ucb",
        iterations: int,
        name: str | None = None,
        tags: Sequence[str] | None = None,
        **options: Any,
    ) -> StudyPublic:
        """A study over a curator's release (the modeler downloads and checks its rows now).

        ``curator_token`` is the partner token the curator created (never echoed back). ``name``: a name
        for people (1-200 characters); ``tags``: up to 20 labels to find the study by, each 1-50 letters,
        digits, ``-_.:`` (e.g. ``["cohort-a", "site:berlin"]``). ``**options``: the other fields of
        ``POST /v1/studies``, e.g. ``strategy_params={...}``, ``hyperparameters="mle"``,
        ``initial_points``, ``seed``, ``gradient_oracle_id`` (instead of ``release_id``, for dp-gibo).
        """
        body: dict[str, Any] = {
            "curator_url": curator_url,
            "curator_token": curator_token,
            "strategy": strategy,
            "iterations": iterations,
            **options,
        }
        if release_id is not None:
            body["release_id"] = release_id
        if name is not None:
            body["name"] = name
        if tags is not None:
            body["tags"] = list(tags)
        return self.client.create_study(body)

    def studies(self, *, name: str | None = None, tag: str | Sequence[str] | None = None) -> StudiesPublic:
        """Every study, oldest first; ``name``: only those whose name contains it (ignoring case);
        ``tag``: a tag or a list of tags, only the studies that have every one (ignoring case)."""
        tags = [] if tag is None else [tag] if isinstance(tag, str) else list(tag)
        return self.client.list_studies(name=name, tags=tags)

    def relabel(
        self, study_id: str, *, name: str | None = None, tags: Sequence[str] | None = None
    ) -> StudyPublic:
        """Change a study's name and/or tags, in any status (``tags`` replace all of its tags; ``[]``
        removes them; ``name=""`` removes the name)."""
        if name is None and tags is None:
            raise ValueError("give a name and/or tags")
        return self.client.update_study(
            study_id,
            name=name or None,
            clear_name=name == "",
            tags=None if tags is None else list(tags),
        )

    def study(self, study_id: str) -> StudyPublic:
        """A study: ``status``, ``iterations_done`` of ``iterations_total``, ``best``, ``error``."""
        return self.client.get_study(study_id)

    def best(self, study_id: str) -> BestPoint | None:
        """The best row so far (``index``, ``y``), or None before the first answer."""
        return self.study(study_id).best

    def run(self, study_id: str, iterations: int | None = None) -> RunAccepted:
        """Run ``iterations`` more (default: the rest of the budget) in the background; see :meth:`wait`."""
        return self.client.run(study_id, iterations)

    def step(self, study_id: str) -> StepResult:
        """One round now, in this call (never retried once sent: a repeat would run another round)."""
        return self.client.step(study_id)

    def stop(self, study_id: str) -> StudyPublic:
        """Stop a running study after the round in flight (409 if it is not running)."""
        return self.client.stop(study_id)

    def wait(
        self, study_id: str, timeout: float | None = None, *, poll: float = 0.2, progress: bool | None = None
    ) -> StudyPublic:
        """Block while the study's run goes on (``running``, ``awaiting_measurement``,
        ``waiting_for_curator``) and return the study once it is ``done`` or ``failed`` (or ``ready``: a
        run of fewer iterations than the budget ended, or was stopped). A failed study is returned, not
        raised: its ``error`` says why.

        ``timeout`` seconds (None: no limit) raise ``TimeoutError``. ``progress``: a rich progress bar;
        by default only when standard output is a terminal.
        """
        if progress is None:
            progress = sys.stdout.isatty()
        deadline = None if timeout is None else time.monotonic() + timeout
        study = self.study(study_id)
        if not progress:
            while study.status in ACTIVE:
                _sleep(poll, deadline, study)
                study = self.study(study_id)
            return study
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn(f"[bold]{study.strategy}[/]"), BarColumn(), MofNCompleteColumn())
        with Progress(*columns, TimeElapsedColumn(), TextColumn("{task.fields[best]}")) as bar:
            task = bar.add_task(study_id, total=study.iterations_total, best="")
            while True:
                best = f"best y {study.best.y:.4g}" if study.best and study.best.y is not None else ""
                bar.update(task, completed=study.iterations_done, best=best)
                if study.status not in ACTIVE:
                    return study
                _sleep(poll, deadline, study)
                study = self.study(study_id)

    def audit(self, study_id: str) -> AuditLog:
        """The study's hash-chained audit log (``entries``: one per request, with its ``index``, ``y`` and
        the strategy's ``details``)."""
        return self.client.audit(study_id)

    def audit_csv(self, study_id: str) -> bytes:
        """The audit log as CSV (the bytes the modeler serves: one line per entry)."""
        return self.client.audit_csv(study_id)

    def verify_audit(self, study_id: str) -> AuditVerification:
        """Recompute the audit log's hash chains on the modeler (``ok``, ``first_bad_seq``)."""
        return self.client.verify_audit(study_id)

    def to_dataframe(self, study_id: str) -> Any:
        """The audit log as a pandas DataFrame, one row per entry (the entry's fields as columns,
        ``details`` a column of dicts). Needs pandas (not a dependency of pobo): an ImportError saying
        ``pip install pandas`` otherwise."""
        pandas = require_pandas()
        entries = self.audit(study_id).entries
        return pandas.DataFrame([entry.model_dump() for entry in entries])

    # -- federations -----------------------------------------------------------------------------------
    def federations(self) -> FederationsPublic:
        """Every federation (DP-FTS-DE)."""
        return self.client.list_federations()

    def federation(self, federation_id: str) -> FederationPublic:
        """One federation: ``status``, ``round``, the epsilon spent so far."""
        return self.client.get_federation(federation_id)

    def create_federation(
        self, *, dimension: int, bounds: Sequence[Sequence[float]], rounds: int, **options: Any
    ) -> FederationPublic:
        """A new DP-FTS-DE federation (``POST /v1/federations``): the search space (``dimension``,
        ``bounds`` [[low, high], ...]), the number of ``rounds`` and any other field of the API's
        ``FederationCreate`` (``P``, ``M``, ``q``, ``z``, ``S``, ``epsilon_budget``, ``round_seconds``...)."""
        body = {"dimension": dimension, "bounds": [list(b) for b in bounds], "rounds": rounds, **options}
        return self.client.create_federation(body)

    def add_agent(self, federation_id: str, name: str) -> AgentCreated:
        """Register a hospital's agent before the start; its token is in the answer, shown once (hand it to
        the hospital for ``pobo agent run``)."""
        return self.client.register_agent(federation_id, name)

    def start_federation(self, federation_id: str) -> FederationPublic:
        """Freeze the agent list and open round 1."""
        return self.client.start_federation(federation_id)


def _sleep(poll: float, deadline: float | None, study: StudyPublic) -> None:
    """Sleep ``poll`` seconds, or what is left before ``deadline``; TimeoutError once it has passed."""
    left = poll if deadline is None else deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(
            f"study {study.id} is still {study.status} ({study.iterations_done} of {study.iterations_total} "
            "iterations) after the timeout; call wait() again or stop() it"
        )
    time.sleep(min(poll, left))
