"""Which process of an agent is calling: two ``pobo agent run`` on one agent token, told from a restart.

Every request of an agent carries a random id of its process (``Pobo-Agent-Instance``, new at each start).
The coordinator remembers, per agent, the instance it heard last and the instances that one replaced:

* the same instance again: nothing to say;
* a new instance: a restart (or a second process) has replaced the old one; said in the log only, since a
  restarted agent legitimately takes over;
* an instance that was replaced and speaks again: two processes are running at once (their requests
  alternate). The answer carries a ``warning`` (and the log a line): both submit for one agent, one
  submission per round counts, and each process's local observations are only half of the agent's.

Memory of this process only (a restart of the modeler forgets; with several workers, each remembers what
it heard, and the alternation is seen once both processes reach one worker). Instance ids are random,
carry nothing about the agent's data, and are never stored in the database.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field

log = logging.getLogger("pobo.modeler.federations")

#: How many replaced instances are remembered per agent (two or three processes are caught; a long run of
#: restarts forgets the oldest).
REMEMBERED = 8


@dataclass
class _Seen:
    current: str
    replaced: deque[str] = field(default_factory=lambda: deque(maxlen=REMEMBERED))


class InstanceTracker:
    """The instances heard per agent id (thread-safe: the routes run in the thread pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._agents: dict[str, _Seen] = {}

    def heard(self, federation_id: str, agent_id: str, instance: str) -> str | None:
        """Record a request of ``instance`` for the agent; the warning its answer carries, or None."""
        with self._lock:
            seen = self._agents.get(agent_id)
            if seen is None:
                self._agents[agent_id] = _Seen(instance)
                return None
            if instance == seen.current:
                return None
            other = seen.current
            back = instance in seen.replaced
            if back:
                seen.replaced.remove(instance)
            seen.replaced.append(other)
            seen.current = instance
        if not back:
            log.info(
                "federation %s: agent %s: a new process (instance %s) replaced instance %s (a restart?)",
                federation_id,
                agent_id,
                instance[:8],
                other[:8],
            )
            return None
        log.warning(
            "federation %s: agent %s: two processes use one agent token (instances %s and %s alternate)",
            federation_id,
            agent_id,
            instance[:8],
            other[:8],
        )
        return (
            f"another process is using this agent's token: its requests alternate with this one's "
            f"(instances {other[:8]} and {instance[:8]}), both submit for the same agent, and only one "
            "submission per round counts. Stop every other `pobo agent run` with this token (a restarted "
            "agent replaces the old process without this warning)."
        )
