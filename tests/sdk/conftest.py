"""The SDK's tests run against both services as real processes: the end-to-end fixtures, re-exported."""

from tests.e2e.conftest import Services, services, workers  # noqa: F401  (fixtures)
