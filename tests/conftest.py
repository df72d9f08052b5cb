"""Suite-wide ordering for ``make test``, which runs the suite in two pytest-xdist workers, a file at a time
per worker (``--dist loadfile``: a module's shared fixtures and started services stay in one process).

The files known to take longest are collected first, so that the two workers start on them and finish
together, instead of one worker taking a long file last while the other idles.
"""

from __future__ import annotations

import pytest

#: The longest files (measured: tens of seconds to minutes each), longest first.
LONG_FILES = (
    "tests/fuzz/test_fuzz_curator.py",
    "tests/modeler_service/test_fuzz_modeler.py",
    "tests/e2e/test_crash_curator.py",
    "tests/e2e/test_restart.py",
    "tests/e2e/test_console.py",
    "tests/e2e/test_federation.py",
    "tests/shared/test_bench_gibo.py",
    "tests/shared/test_bench.py",
    "tests/e2e/test_concurrency.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: k for k, path in enumerate(LONG_FILES)}

    def key(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return rank.get(path, len(LONG_FILES))

    items.sort(key=key)  # (a stable sort: the order within a file, and of the other files, is kept)
