"""The background round closer of the federations: a thread of the modeler process.

Every ``federation_tick_seconds`` (and at once when the process starts, so a round whose deadline passed
while the modeler was down is closed first thing: restart-safe) it closes every open round past its
deadline (``service.close_overdue``; a conditional UPDATE makes each close happen once, whatever the
number of closers: worker processes, a long-poll that found its round late). Between passes a second
thread precomputes the accounting the next closes need (dp-accounting takes seconds on a cold cache), so
that closing a round never waits for it.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from modeler_service.context import Context
from modeler_service.federations import accounting, service

log = logging.getLogger("pobo.modeler.federations")


class RoundCloser:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warmer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pobo-fed-accounting")
        self._warmed: set[tuple[float, float, float, int]] = set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="pobo-fed-closer", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._warmer.shutdown(wait=False, cancel_futures=True)

    def run_once(self) -> int:
        """One pass: close overdue rounds, then queue the accounting of the open ones. Returns closes."""
        closed = service.close_overdue(self.ctx.db)
        for params, number in service.open_round_params(self.ctx.db):
            key = (float(params["q"]), float(params["z"]), float(params["delta"]), number)
            if key not in self._warmed and not self._stop.is_set():
                self._warmed.add(key)
                self._warmer.submit(accounting.warm_accounting, params, number)
        return closed

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - the closer must outlive a database outage
                log.warning("round closer: %s; trying again", type(exc).__name__)
            self._stop.wait(self.ctx.settings.federation_tick_seconds)
