"""``RunnerRegistry.start`` right after a run settled: the previous runner thread, which has left the
study's active states and is returning, is waited for instead of answering 409 "already has a runner" (the
race a run asked for the moment the last round closed used to lose); a runner that does not end is still
refused."""

from __future__ import annotations

import threading

import pytest

from modeler_service.exceptions import Conflict
from modeler_service.runner import RunnerRegistry


class _Registry(RunnerRegistry):
    """The registry's bookkeeping with a runner body that only records that it ran."""

    def __init__(self) -> None:
        super().__init__(ctx=None, stepper=None)  # type: ignore[arg-type]
        self.ran: list[str] = []

    def _run(self, study_id: str, stop: threading.Event) -> None:
        self.ran.append(study_id)


def _previous_runner(registry: RunnerRegistry, study_id: str, release: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    registry._threads[study_id] = (thread, threading.Event())
    return thread


def test_a_runner_that_is_ending_is_waited_for() -> None:
    registry = _Registry()
    ending = threading.Event()
    previous = _previous_runner(registry, "s1", ending)
    threading.Timer(0.3, ending.set).start()  # it returns a moment after the new claim
    registry.start("s1")
    previous.join(1)
    registry._threads["s1"][0].join(1)
    assert registry.ran == ["s1"] and not previous.is_alive()


def test_a_runner_that_does_not_end_is_still_a_conflict() -> None:
    registry = _Registry()
    stuck = threading.Event()
    _previous_runner(registry, "s2", stuck)
    with pytest.raises(Conflict, match="already has a runner"):
        registry.start("s2", exit_wait=0.3)
    stuck.set()
    assert registry.ran == []
