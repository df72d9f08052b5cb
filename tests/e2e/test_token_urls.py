"""Issue 12, item 1, on real service processes: a credential put in a URL never reaches a log."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import SQLITE_ONLY, Services
from tests.e2e.test_token_logs import _forbidden

pytestmark = [pytest.mark.slow, SQLITE_ONLY]  # see SQLITE_ONLY in conftest


@pytest.fixture(params=[1, 2], ids=["1-process", "2-workers"])
def workers(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def test_a_token_in_a_url_never_reaches_a_log(services: Services) -> None:
    """Issue 12, item 1: a client that puts a credential in the query string by mistake gets its 401 (or
    its answer), and neither service's log shows the credential, in one process or with workers (TLS is
    covered in tests/e2e/test_tls.py)."""
    with services.admin() as admin:
        partner = admin.create_partner("p", release_ids=[], max_queries=1)
    probes = [
        (services.curator.url, f"/v1/partners/me?token={partner.token}", {}),
        (services.curator.url, f"/v1/datasets?access_token={services.admin_token}&x=1", {}),
        (services.modeler.url, f"/v1/studies?api_key={services.modeler_token}", {}),
        (
            services.curator.url,
            f"/v1/partners/me?token={partner.token}",
            {"Authorization": f"Bearer {partner.token}"},
        ),
    ]
    for base, path, headers in probes:
        with httpx.Client(base_url=base, timeout=30) as client:
            r = client.get(path, headers=headers)
        assert r.status_code in (200, 401), r.text
    services.curator.stop()
    services.modeler.stop()  # flush and close the logs
    logs = services.curator.log_path.read_text(errors="replace") + services.modeler.log_path.read_text(
        errors="replace"
    )
    assert "/v1/partners/me?[redacted]" in logs and "/v1/studies?[redacted]" in logs  # the lines are there
    for secret in _forbidden([partner.token, services.admin_token, services.modeler_token]):
        assert secret not in logs, f"{secret!r} in a service log"
