"""What the modeler's use cases need besides a session: settings, database, crypto, curator clients and the
in-memory strategy cache (``StudyCache``). How curator errors become the modeler's own (``upstream``) is in
``modeler_service.upstream``, re-exported here."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.fernet import Fernet, InvalidToken

from modeler_service.config import Settings
from modeler_service.db import Database
from modeler_service.exceptions import Conflict, StorageError
from modeler_service.kinds import StudyFacts, facts_of, kind_of
from modeler_service.models import Study
from modeler_service.upstream import ClientFactory, upstream
from shared.bo.strategies import Strategy
from shared.protocol.client import CuratorClient
from shared.servicekit.tls import client_ssl_context

log = logging.getLogger("pobo.modeler")

__all__ = [
    "ClientFactory",
    "Context",
    "NotClaimed",
    "StudyCache",
    "StudyFacts",
    "StudyState",
    "default_client_factory",
    "upstream",
]


@dataclass
class StudyState:
    """In-memory companions of a study: what its strategy runs on (Z, or a gradient oracle's domain), the
    rebuilt strategy with the rounds and queries it has observed, the study's fixed attributes, and a
    curator client."""

    inputs: Any  # the strategy's first argument: Z [n, r], a gradient oracle's domain, ... (its kind's)
    strategy: Strategy[Any, Any] | None = None
    n_rounds: int = -1  # rounds the cached strategy has observed
    n_queries: int = -1  # queries (audit entries) in those rounds; -1 with n_rounds -1
    #: the study's ``supersessions_done`` when the cached strategy was built (it observed those values)
    n_supersessions: int = 0
    facts: StudyFacts | None = None
    client: CuratorClient | None = None
    #: What the curator will no longer answer under the study's grant (its kind's ``exclusions``), learnt
    #: at a refusal and set on every strategy rebuilt from here on; None: nothing known.
    excluded: npt.NDArray[np.bool_] | None = None
    lock: threading.RLock = field(default_factory=threading.RLock)


class StudyCache:
    """Per-study Z arrays, strategies (keyed by the rounds they observed) and curator clients."""

    def __init__(self) -> None:
        self._states: dict[str, StudyState] = {}
        self._retired: list[CuratorClient] = []  # clients of rotated tokens, closed with the cache
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

    def retire_client(self, study_id: str) -> None:
        """The study's next request makes a new curator client (a new token); a round in flight keeps the
        one it holds, which is closed with the cache."""
        state = self.get(study_id)
        if state is None:
            return
        with state.lock:
            if state.client is not None:
                with self._lock:
                    self._retired.append(state.client)
                state.client = None

    def close(self) -> None:
        with self._lock:
            states, self._states = list(self._states.values()), {}
            retired, self._retired = self._retired, []
        for state in states:
            if state.client is not None:
                state.client.close()
        for client in retired:
            client.close()


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
        """The cached companions of ``study`` (what its strategy runs on loaded by its request kind on
        first use: Z sha256-checked, a gradient oracle's domain, ...)."""
        state = self.cache.get(study.id)
        if state is not None:
            return state
        inputs = kind_of(study).load_inputs(self.data_dir, study)
        return self.cache.put(study.id, StudyState(inputs, facts=facts_of(study)))

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


class NotClaimed(Conflict):
    """The study could not be claimed for a step or a run (someone else owns it, or it is done)."""
