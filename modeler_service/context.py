"""What the modeler's use cases need besides a session: settings, database, crypto, curator clients and the
in-memory strategy cache (``StudyCache``); and how curator errors become the modeler's own (``upstream``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.fernet import Fernet, InvalidToken

from modeler_service.config import Settings
from modeler_service.db import Database
from modeler_service.exceptions import (
    Conflict,
    NotFound,
    QuotaExceeded,
    StorageError,
    Unprocessable,
    UpstreamError,
)
from modeler_service.models import Study
from shared.bo.strategies import GradientDomain, Strategy, get_strategy
from shared.protocol.client import CuratorClient, CuratorError, CuratorProtocolError, npy_sha256
from shared.servicekit.tls import client_ssl_context

log = logging.getLogger("pobo.modeler")

ClientFactory = Callable[[str, str], CuratorClient]


@dataclass(frozen=True)
class StudyFacts:
    """The attributes of a study that never change after it is created and that planning a round reads
    (copied out of the row, so they stay readable whatever happens to the session that loaded it)."""

    id: str
    strategy: str
    seed: int | None
    n: int
    gradient_oracle_id: int | None
    iterations_total: int

    @classmethod
    def of(cls, study: Study) -> StudyFacts:
        return cls(
            study.id, study.strategy, study.seed, study.n, study.gradient_oracle_id, study.iterations_total
        )


@dataclass
class StudyState:
    """In-memory companions of a study: what its strategy runs on (Z, or a gradient oracle's domain), the
    rebuilt strategy with the rounds and queries it has observed, the study's fixed attributes, and a
    curator client."""

    Z: npt.NDArray[np.float64] | None
    domain: GradientDomain | None = None
    strategy: Strategy[Any, Any] | None = None
    n_rounds: int = -1  # rounds the cached strategy has observed
    n_queries: int = -1  # queries (audit entries) in those rounds; -1 with n_rounds -1
    facts: StudyFacts | None = None
    client: CuratorClient | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def inputs(self) -> Any:
        """The strategy's first argument: Z [n, r] (a release study) or the ``GradientDomain``."""
        return self.Z if self.Z is not None else self.domain


class StudyCache:
    """Per-study Z arrays, strategies (keyed by the rounds they observed) and curator clients."""

    def __init__(self) -> None:
        self._states: dict[str, StudyState] = {}
        self._lock = threading.Lock()

    def get(self, study_id: str) -> StudyState | None:
        with self._lock:
            return self._states.get(study_id)

    def put(self, study_id: str, state: StudyState) -> StudyState:
        with self._lock:
            return self._states.setdefault(study_id, state)

    def drop(self, study_id: str) -> None:
        with self._lock:
            state = self._states.pop(study_id, None)
        if state is not None and state.client is not None:
            state.client.close()

    def close(self) -> None:
        with self._lock:
            states, self._states = list(self._states.values()), {}
        for state in states:
            if state.client is not None:
                state.client.close()


@dataclass
class Context:
    """What the use cases need besides a session: settings, database, crypto, curator access, caches."""

    settings: Settings
    db: Database
    fernet: Fernet
    client_factory: ClientFactory
    cache: StudyCache = field(default_factory=StudyCache)

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    def encrypt(self, token: str) -> str:
        return self.fernet.encrypt(token.encode("utf-8")).decode("ascii")

    def decrypt(self, token_enc: str) -> str:
        try:
            return self.fernet.decrypt(token_enc.encode("ascii")).decode("utf-8")
        except InvalidToken as exc:
            raise StorageError(
                "the stored curator token cannot be decrypted with the configured secret key "
                "(POBO_MODELER_SECRET_KEY or <data_dir>/secret.key changed?)"
            ) from exc

    def state(self, study: Study) -> StudyState:
        """The cached companions of ``study`` (Z loaded and sha256-checked on first use; a study over a
        gradient oracle gets the oracle's domain from its stored public parameters instead)."""
        state = self.cache.get(study.id)
        if state is not None:
            return state
        if get_strategy(study.strategy).runs_on == "gradient-oracle":
            if not study.gradient_oracle:
                raise StorageError(f"study {study.id} runs on a gradient oracle but has no oracle parameters")
            domain = GradientDomain.from_public(study.gradient_oracle)
            return self.cache.put(study.id, StudyState(Z=None, domain=domain, facts=StudyFacts.of(study)))
        if study.z_file is None or study.z_sha256 is None:
            raise StorageError(f"study {study.id} runs on a release but has no stored Z")
        path = self.data_dir / study.z_file
        try:
            digest = npy_sha256(path)
            if digest != study.z_sha256:
                raise StorageError(
                    f"the stored Z of study {study.id} has sha256 {digest}, expected {study.z_sha256}"
                )
            Z = np.load(path, allow_pickle=False)
        except OSError as exc:
            raise StorageError(f"the stored Z of study {study.id} cannot be read: {exc.strerror}") from exc
        return self.cache.put(study.id, StudyState(Z=Z, facts=StudyFacts.of(study)))

    def client(self, study: Study) -> CuratorClient:
        state = self.state(study)
        with state.lock:
            if state.client is None:
                state.client = self.client_factory(study.curator_url, self.decrypt(study.curator_token_enc))
            return state.client


def default_client_factory(settings: Settings) -> ClientFactory:
    # One verifying TLS context for every study: the curator's CA bundle (or the system trust store), plus
    # the modeler's client certificate when mutual TLS is configured. Only used for https:// curator URLs.
    context = client_ssl_context(
        settings.curator_ca_bundle,
        client_cert=settings.curator_client_cert,
        client_key=settings.curator_client_key,
    )

    def factory(url: str, token: str) -> CuratorClient:
        return CuratorClient(
            url, token, timeout=settings.curator_timeout, retries=settings.curator_retries, verify=context
        )

    return factory


def upstream(exc: CuratorError, what: str) -> Exception:
    """A curator error as the modeler's own: refused token 422, other 4xx pass through, the rest 502 (and
    502 for any answer that is not a pobo curator's, whatever its status)."""
    if isinstance(exc, CuratorProtocolError):
        return UpstreamError(f"{what}: the server at curator_url does not answer like a pobo curator: {exc}")
    if exc.status_code in (401, 403):  # the caller's curator_token is wrong or revoked: a client error
        return Unprocessable(
            f"{what}: the curator refused the study's partner token ({exc.status_code}: {exc.detail}); it "
            "may be mistyped or revoked: ask the curator for a valid partner token (a study keeps the token "
            "it was created with, so create a new study with the new one)"
        )
    if exc.status_code == 404:
        return NotFound(
            f"{what}: not found at the curator ({exc.detail}); it may not exist or may not be granted to "
            "this partner token (any more): ask the curator"
        )
    if exc.status_code == 409:
        return Conflict(f"{what}: {exc.detail}")
    if exc.status_code == 422:
        return Unprocessable(f"{what}: the curator rejected the request ({exc.detail})")
    if exc.status_code == 429:
        return QuotaExceeded(
            f"{what}: the curator's query quota for this partner token is used up ({exc.detail}); ask the "
            "curator for a larger quota, then POST /v1/studies/{id}/run to continue"
        )
    return UpstreamError(f"{what}: {exc}; if this persists, ask the curator's operator to check its log")


class NotClaimed(Conflict):
    """The study could not be claimed for a step or a run (someone else owns it, or it is done)."""
