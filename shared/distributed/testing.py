"""Certificates for a TLS Dask cluster on one machine (tests, trying the TLS set-up out).

``write_certificates(directory)`` makes a CA and one certificate it signs, valid for the scheduler, the
workers and the clients (``serverAuth`` and ``clientAuth``; Dask checks the CA, not host names). A
production cluster's CA is the curator's own, its key kept off the cluster (docs/scaling.md).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.distributed.cluster import TlsFiles

__all__ = ["ClusterCertificates", "certificate_authority", "cluster_security", "write_certificates"]


@dataclass(frozen=True)
class ClusterCertificates:
    """The PEM files of ``write_certificates``: the CA's certificate and key, and the signed pair."""

    ca: Path
    ca_key: Path
    cert: Path
    key: Path

    @property
    def client(self) -> TlsFiles:
        return TlsFiles(ca=self.ca, cert=self.cert, key=self.key)


def _write(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def certificate_authority(common_name: str, *, days: int = 1) -> tuple[Any, Any]:
    """(key, certificate) of a new throwaway CA (EC P-256, valid from five minutes ago for ``days``): signs
    certificates, nothing else. For tests and trials only."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def write_certificates(directory: Path, *, name: str = "pobo-test", days: int = 2) -> ClusterCertificates:
    """A new CA (EC P-256) and a certificate it signs, as PEM files in ``directory`` (keys 0600)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key, ca_cert = certificate_authority(f"{name} CA", days=days)
    ca_name = ca_cert.subject
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.DNSName(name)]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    def private(k: Any) -> bytes:
        return bytes(
            k.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    return ClusterCertificates(
        ca=_write(directory / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM)),
        ca_key=_write(directory / "ca-key.pem", private(ca_key)),
        cert=_write(directory / "cert.pem", cert.public_bytes(serialization.Encoding.PEM)),
        key=_write(directory / "key.pem", private(key)),
    )


def cluster_security(certs: ClusterCertificates) -> Any:
    """A ``distributed.security.Security`` for the scheduler, the workers and the clients of a cluster
    started in this process (one certificate for every role), encryption required."""
    from distributed import security as dask_security

    Security: Any = dask_security.Security  # distributed is untyped
    return Security(
        tls_ca_file=str(certs.ca),
        tls_scheduler_cert=str(certs.cert),
        tls_scheduler_key=str(certs.key),
        tls_worker_cert=str(certs.cert),
        tls_worker_key=str(certs.key),
        tls_client_cert=str(certs.cert),
        tls_client_key=str(certs.key),
        require_encryption=True,
    )
