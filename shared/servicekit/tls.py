"""TLS between the organisations: server-side checks, the plaintext warning, client-side verification.

Both services serve HTTPS when given a certificate and a key (settings ``tls_certfile``/``tls_keyfile``,
handed to uvicorn); the modeler verifies the curator's certificate against ``curator_ca_bundle`` (or the
system trust store). Verification is never switched off by this module.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import sys
from pathlib import Path

__all__ = ["check_tls_files", "client_ssl_context", "is_loopback", "uvicorn_ssl_options", "warn_if_plaintext"]


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1`` (a bind address no other machine can reach)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_tls_files(certfile: Path | None, keyfile: Path | None, *, prefix: str) -> None:
    """Both or neither of certificate and key, each a readable file; else ``ValueError`` naming the setting.

    ``prefix`` is the services' environment prefix (``POBO_CURATOR_``), so the message names the variable.
    """
    if (certfile is None) != (keyfile is None):
        pair = ("TLS_CERTFILE", "TLS_KEYFILE")
        given, missing = pair if keyfile is None else pair[::-1]
        raise ValueError(
            f"{prefix}{given} is set but {prefix}{missing} is not: HTTPS needs both the certificate and its "
            "private key (set both, or neither for plain HTTP on loopback)"
        )
    for name, path in (("TLS_CERTFILE", certfile), ("TLS_KEYFILE", keyfile)):
        if path is None:
            continue
        if not path.is_file():
            raise ValueError(f"{prefix}{name}: {path} does not exist or is not a file")
        if not os.access(path, os.R_OK):
            raise ValueError(f"{prefix}{name}: {path} is not readable by this process")


def warn_if_plaintext(logger: logging.Logger, host: str, *, tls: bool, service: str, prefix: str) -> bool:
    """Log (and print to stderr) a loud WARNING when binding a non-loopback address without TLS.

    Returns True when it warned. Tokens, queried indices and outcomes would cross the network in clear.
    """
    if tls or is_loopback(host):
        return False
    message = (
        f"the {service} is listening on {host} WITHOUT TLS: bearer tokens, row indices and outcomes travel "
        f"in clear text and can be read or altered on the network. Set {prefix}TLS_CERTFILE and "
        f"{prefix}TLS_KEYFILE (or put a TLS-terminating proxy in front and bind 127.0.0.1)."
    )
    logger.warning(message)
    print(f"WARNING: pobo {message}", file=sys.stderr, flush=True)
    return True


def client_ssl_context(
    ca_bundle: Path | str | None = None,
    *,
    client_cert: Path | str | None = None,
    client_key: Path | str | None = None,
) -> ssl.SSLContext:
    """A verifying client context: the CA bundle given (PEM), else the system trust store.

    Hostname checking and certificate verification stay on (``ssl.create_default_context``). A client
    certificate (mutual TLS) is loaded when given.
    """
    if ca_bundle is not None:
        path = Path(ca_bundle)
        if not path.is_file():
            raise ValueError(f"CA bundle {path} does not exist or is not a file")
        context = ssl.create_default_context(cafile=str(path))
    else:
        context = ssl.create_default_context()
    if client_cert is not None:
        context.load_cert_chain(str(client_cert), str(client_key) if client_key is not None else None)
    return context


def uvicorn_ssl_options(
    certfile: Path | None, keyfile: Path | None, keyfile_password: str | None = None
) -> dict[str, str]:
    """The ``ssl_*`` keyword arguments of ``uvicorn.run`` (empty without a certificate: plain HTTP)."""
    if certfile is None or keyfile is None:
        return {}
    options = {"ssl_certfile": str(certfile), "ssl_keyfile": str(keyfile)}
    if keyfile_password:
        options["ssl_keyfile_password"] = keyfile_password
    return options
