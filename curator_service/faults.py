"""Named pause points for crash tests (testing only; off unless the environment asks for them).

``POBO_CURATOR_FAULT_PAUSE="release.after_file=60,query.after_commit=60"`` makes the process sleep that many
seconds when it reaches the named point, so a test can SIGKILL it at exactly that moment. Unset (always, in
production) a pause point costs one environment lookup. No API can set it.
"""

from __future__ import annotations

import logging
import os
import time

logger = logging.getLogger("curator_service")

ENV = "POBO_CURATOR_FAULT_PAUSE"


def pause_point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    for item in spec.split(","):
        point, _, seconds = item.partition("=")
        if point.strip() == name:
            logger.warning("fault injection: pausing %s s at %s (%s set: testing only)", seconds, name, ENV)
            time.sleep(float(seconds or 0))
