"""TLS between the organisations: both services over HTTPS with a throwaway CA made at test time.

The two-party loop (upload, release, grant, study, run, audit verify) runs over HTTPS, the modeler verifying
the curator's certificate against ``POBO_MODELER_CURATOR_CA_BUNDLE``; a client without the CA, a certificate
for another host and plain HTTP to the TLS port all fail. Settings validation and the loud warning for a
non-loopback bind without TLS are checked on ``serve()`` with uvicorn stubbed out.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
import secrets
import signal
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pydantic import ValidationError
from sqlalchemy import create_engine, text

from shared.distributed.testing import certificate_authority
from shared.processes import ServiceProcess, curator_env, free_port, modeler_env
from shared.protocol.client import CuratorClient, CuratorUnavailable
from shared.servicekit.tls import client_ssl_context, is_loopback
from tests.e2e.conftest import write_csv

PG_URL = os.environ.get("POBO_TEST_DATABASE_URL")

# ------------------------------------------------------------------------------------------ throwaway PKI


@dataclass(frozen=True)
class Pki:
    ca: Path  # PEM certificate of the throwaway CA
    cert: Path  # server certificate for 127.0.0.1 / localhost, signed by the CA
    key: Path
    wrong_cert: Path  # signed by the same CA, but for another host name only
    wrong_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    names: list[x509.GeneralName],
    out: Path,
    stem: str,
) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"pobo test {stem}"))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = out / f"{stem}.pem", out / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)
    return cert_path, key_path


def make_pki(out: Path) -> Pki:
    """A CA (EC P-256, valid one day) and two server certificates signed by it."""
    out.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = certificate_authority("pobo throwaway test CA")
    ca_name = ca_cert.subject
    ca_path = out / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    local = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    cert, key = _leaf(ca_key, ca_name, local, out, "server")
    wrong_cert, wrong_key = _leaf(ca_key, ca_name, [x509.DNSName("other-org.example")], out, "wrong")
    return Pki(ca_path, cert, key, wrong_cert, wrong_key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# ------------------------------------------------------------------------------- both services over HTTPS


@dataclass
class TlsServices:
    curator: ServiceProcess
    modeler: ServiceProcess
    admin_token: str
    modeler_token: str
    tmp: Path


@pytest.fixture(params=["sqlite"])  # TLS is between the services: the database does not matter here
def tls_services(request: pytest.FixtureRequest, tmp_path: Path, pki: Pki) -> Iterator[TlsServices]:
    schema = None
    db_url: str | None = None
    if request.param == "postgresql":
        if not PG_URL:
            pytest.skip("POBO_TEST_DATABASE_URL is not set")
        schema = f"pobo_tls_{uuid.uuid4().hex[:10]}"
        engine = create_engine(PG_URL)
        with engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        engine.dispose()
        sep = "&" if "?" in PG_URL else "?"
        db_url = f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    admin_token, modeler_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    context = client_ssl_context(pki.ca)
    curator = ServiceProcess(
        "curator",
        port=free_port(),
        env={
            **curator_env(tmp_path / "curator", admin_token, db_url),
            "POBO_CURATOR_TLS_CERTFILE": str(pki.cert),
            "POBO_CURATOR_TLS_KEYFILE": str(pki.key),
        },
        log_path=tmp_path / "curator.log",
        scheme="https",
        verify=context,
    )
    modeler = ServiceProcess(
        "modeler",
        port=free_port(),
        env=modeler_env(
            tmp_path / "modeler",
            modeler_token,
            db_url,
            POBO_MODELER_TLS_CERTFILE=str(pki.cert),
            POBO_MODELER_TLS_KEYFILE=str(pki.key),
            POBO_MODELER_CURATOR_CA_BUNDLE=str(pki.ca),
        ),
        log_path=tmp_path / "modeler.log",
        scheme="https",
        verify=context,
    )
    try:
        curator.start()
        modeler.start()
        curator.wait_healthy()
        modeler.wait_healthy()
        yield TlsServices(curator, modeler, admin_token, modeler_token, tmp_path)
    finally:
        modeler.stop()
        curator.stop()
        if schema is not None:
            engine = create_engine(PG_URL)  # type: ignore[arg-type]
            with engine.begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
            engine.dispose()


def _wait_done(http: httpx.Client, study_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        study: dict[str, Any] = http.get(f"/v1/studies/{study_id}").json()
        if study["status"] in {"done", "failed"}:
            return study
        assert time.monotonic() < deadline, f"study stuck in {study['status']}"
        time.sleep(0.05)


@pytest.mark.slow
def test_two_party_loop_over_https(tls_services: TlsServices, pki: Pki) -> None:
    s = tls_services
    assert s.curator.url.startswith("https://") and s.modeler.url.startswith("https://")
    csv = s.tmp / "data.csv"
    outcomes = write_csv(csv, n=200)
    with CuratorClient(s.curator.url, s.admin_token, verify=pki.ca) as admin:
        dataset = admin.upload_dataset(csv, name="tls", objective="objective")
        release = admin.create_release(dataset.id, epsilon=1.0, delta=1e-4)
        partner = admin.create_partner("tls modeler", release_ids=[release.id], max_queries=20)

    with httpx.Client(
        base_url=s.modeler.url,
        headers={"Authorization": f"Bearer {s.modeler_token}"},
        timeout=60,
        verify=client_ssl_context(pki.ca),
    ) as http:
        resp = http.post(
            "/v1/studies",
            json={
                "curator_url": s.curator.url,  # https: the modeler verifies it against its CA bundle
                "release_id": release.id,
                "curator_token": partner.token,
                "iterations": 5,
                "hyperparameters": "mle",
                "initial_points": 2,
            },
        )
        assert resp.status_code == 201, resp.text
        study_id = resp.json()["id"]
        assert http.post(f"/v1/studies/{study_id}/run").status_code == 202
        done = _wait_done(http, study_id)
        assert done["status"] == "done", done["error"]
        audit = http.get(f"/v1/studies/{study_id}/audit").json()["entries"]
        verify = http.get(f"/v1/studies/{study_id}/audit/verify").json()
    assert verify == {
        "ok": True,
        "entries": 5,
        "first_bad_seq": None,
        "supersessions": 0,
        "first_bad_supersession_seq": None,
    }
    assert [e["y"] for e in audit] == [pytest.approx(outcomes[e["index"]]) for e in audit]

    with CuratorClient(s.curator.url, s.admin_token, verify=pki.ca) as admin:
        curator_log = admin.list_queries(release.id).queries
    assert [(q.id, q.index) for q in curator_log] == [(e["curator_query_id"], e["index"]) for e in audit]

    # Without the CA (system trust store only) the curator's certificate does not verify.
    with CuratorClient(s.curator.url, s.admin_token, retries=0) as stranger:
        with pytest.raises(CuratorUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            stranger.healthz()
    # Plain HTTP to the TLS port gets no answer (the TLS handshake never happens).
    plain = s.curator.url.replace("https://", "http://")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{plain}/healthz", timeout=5)
    with CuratorClient(plain, s.admin_token, retries=0) as client:
        with pytest.raises(CuratorUnavailable):
            client.healthz()

    # Issue 12, item 1, over TLS: a token put in the URL by mistake is answered and never logged.
    with httpx.Client(base_url=s.curator.url, timeout=30, verify=client_ssl_context(pki.ca)) as c:
        assert c.get(f"/v1/partners/me?token={partner.token}").status_code == 401
    with httpx.Client(base_url=s.modeler.url, timeout=30, verify=client_ssl_context(pki.ca)) as m:
        assert m.get(f"/v1/studies?token={s.modeler_token}").status_code == 401
    s.curator.stop()
    s.modeler.stop()
    logs = s.curator.log_path.read_text(errors="replace") + s.modeler.log_path.read_text(errors="replace")
    assert "/v1/partners/me?[redacted]" in logs
    assert partner.token not in logs and s.modeler_token not in logs


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b'{"status":"ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def https_server(pki: Pki) -> Iterator[Callable[[Path, Path], str]]:
    """An HTTPS server on 127.0.0.1 presenting a chosen certificate; yields a starter returning its URL."""
    servers: list[ThreadingHTTPServer] = []

    def start(cert: Path, key: Path) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"https://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_certificate_for_another_host_is_refused(pki: Pki, https_server: Callable[[Path, Path], str]) -> None:
    # Control: the same CA and server code accept the certificate issued for 127.0.0.1.
    good = https_server(pki.cert, pki.key)
    assert httpx.get(f"{good}/healthz", verify=client_ssl_context(pki.ca)).status_code == 200
    # Signed by the trusted CA, but issued for other-org.example: the hostname check refuses it.
    wrong = https_server(pki.wrong_cert, pki.wrong_key)
    with CuratorClient(wrong, "t", retries=0, verify=pki.ca) as client:
        with pytest.raises(CuratorUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            client.healthz()


# ------------------------------------------------------------------------------ settings and the warning


def test_is_loopback() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "curator.example"))  # noqa: S104


@pytest.mark.parametrize("kind", ["curator", "modeler"])
def test_tls_settings_validated_at_start(kind: str, pki: Pki, tmp_path: Path) -> None:
    settings_cls, prefix = _settings(kind)
    with pytest.raises(ValidationError, match=f"{prefix}TLS_CERTFILE is set but {prefix}TLS_KEYFILE is not"):
        settings_cls(tls_certfile=pki.cert)
    with pytest.raises(ValidationError, match=f"{prefix}TLS_KEYFILE is set but {prefix}TLS_CERTFILE is not"):
        settings_cls(tls_keyfile=pki.key)
    missing = tmp_path / "nope.pem"
    with pytest.raises(ValidationError, match=f"{prefix}TLS_KEYFILE: .*nope.pem does not exist"):
        settings_cls(tls_certfile=pki.cert, tls_keyfile=missing)
    ok = settings_cls(tls_certfile=pki.cert, tls_keyfile=pki.key)
    assert ok.tls_enabled and not settings_cls().tls_enabled


def test_modeler_ca_bundle_must_exist(tmp_path: Path) -> None:
    from modeler_service.config import Settings

    with pytest.raises(ValidationError, match="POBO_MODELER_CURATOR_CA_BUNDLE: .*missing.pem does not exist"):
        Settings(curator_ca_bundle=tmp_path / "missing.pem")


def _settings(kind: str) -> tuple[Any, str]:
    if kind == "curator":
        from curator_service.config import Settings as CuratorSettings

        return CuratorSettings, "POBO_CURATOR_"
    from modeler_service.config import Settings as ModelerSettings

    return ModelerSettings, "POBO_MODELER_"


@pytest.mark.parametrize("kind", ["curator", "modeler"])
@pytest.mark.parametrize(
    ("host", "tls", "warns"),
    [("0.0.0.0", False, True), ("127.0.0.1", False, False), ("0.0.0.0", True, False)],  # noqa: S104
)
def test_plaintext_bind_warns_loudly(
    kind: str,
    host: str,
    tls: bool,
    warns: bool,
    pki: Pki,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import uvicorn

    _, prefix = _settings(kind)
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda _app, **kw: calls.append(kw))
    monkeypatch.setattr(signal, "signal", lambda *_a: None)  # serve() must not touch this process's handlers
    monkeypatch.setenv(f"{prefix}DATA_DIR", str(tmp_path / kind))
    monkeypatch.setenv(
        f"{prefix}{'ADMIN_TOKEN' if kind == 'curator' else 'TOKEN'}", "test-token-0123456789abcdef"
    )
    monkeypatch.delenv(f"{prefix}DATABASE_URL", raising=False)
    if tls:
        monkeypatch.setenv(f"{prefix}TLS_CERTFILE", str(pki.cert))
        monkeypatch.setenv(f"{prefix}TLS_KEYFILE", str(pki.key))
    if kind == "curator":
        from curator_service.main import serve
    else:
        from modeler_service.main import serve

    umask = os.umask(0o022)  # serve() sets umask 077 for the service process: restore ours afterwards
    try:
        with caplog.at_level(logging.WARNING):
            serve(host=host, port=free_port())
    finally:
        os.umask(umask)
    assert len(calls) == 1 and calls[0]["host"] == host
    if tls:
        assert calls[0]["ssl_certfile"] == str(pki.cert) and calls[0]["ssl_keyfile"] == str(pki.key)
    else:
        assert "ssl_certfile" not in calls[0]
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "WITHOUT TLS" in r.getMessage()
    ]
    stderr = capsys.readouterr().err
    if warns:
        assert len(warnings) == 1
        assert f"{prefix}TLS_CERTFILE" in warnings[0] and f"{prefix}TLS_KEYFILE" in warnings[0]
        assert "WITHOUT TLS" in stderr and "test-token" not in stderr + warnings[0]
    else:
        assert warnings == [] and "WITHOUT TLS" not in stderr


def test_compose_tls_override_names_real_settings() -> None:
    import yaml

    from curator_service.config import Settings as CuratorSettings
    from modeler_service.config import Settings as ModelerSettings

    root = Path(__file__).resolve().parents[2]
    override = yaml.safe_load((root / "compose.tls.yaml").read_text(encoding="utf-8"))
    base = yaml.safe_load((root / "compose.yaml").read_text(encoding="utf-8"))
    for service, settings_cls, prefix in (
        ("curator", CuratorSettings, "POBO_CURATOR_"),
        ("modeler", ModelerSettings, "POBO_MODELER_"),
    ):
        svc = override["services"][service]
        assert service in base["services"]
        assert "./certs:/certs:ro" in svc["volumes"]  # certificates mounted read-only
        env = svc["environment"]
        for key, value in env.items():  # a typo would be silently ignored by pydantic-settings
            assert key.startswith(prefix) and key[len(prefix) :].lower() in settings_cls.model_fields
            assert str(value).startswith("/certs/")
        assert {f"{prefix}TLS_CERTFILE", f"{prefix}TLS_KEYFILE"} <= set(env)
        port = base["services"][service]["command"][-1]
        assert f"https://127.0.0.1:{port}/healthz" in svc["healthcheck"]["test"][-1]
    assert override["services"]["modeler"]["environment"]["POBO_MODELER_CURATOR_CA_BUNDLE"] == "/certs/ca.pem"
