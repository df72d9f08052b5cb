"""Running a pobo service under uvicorn, in one process or with several worker processes.

With ``workers > 1`` uvicorn's supervisor binds the socket once and *spawns* the workers, each of which
builds its own app from an import string (``module:factory``). The service's one-time start-up work
(database migrations, crash recovery, generating token files) therefore runs in the parent, before the
workers exist, and each worker only opens its own database pool: a worker restarted by the supervisor
never re-runs recovery over requests its siblings are serving.

Only ``uvicorn`` is imported here (lazily), never FastAPI or SQLAlchemy.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import logging
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal, NoReturn, Protocol

from pydantic import SecretStr

from shared.servicekit.tls import uvicorn_ssl_options, warn_if_plaintext

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d]: %(message)s"

#: The failed-token log the workers of one service share (``servicekit.asgi_guards.SharedFailureLog``), in its
#: data dir; deleted by the start-up work, so every start begins with a clean slate.
THROTTLE_FILE = "auth-failures.db"


def reset_throttle(data_dir: Path) -> None:
    """Delete the shared failed-token log (and its WAL files); start-up work, before any worker runs."""
    for suffix in ("", "-wal", "-shm"):
        (data_dir / f"{THROTTLE_FILE}{suffix}").unlink(missing_ok=True)


#: Description of both services' ``workers`` setting.
WORKERS_HELP = (
    "uvicorn worker processes. Above 1, start-up work (migrations, crash recovery) runs once in the "
    "supervisor before the workers start; use a database they can share (PostgreSQL, or SQLite on a "
    "local disk)."
)


#: Shortest operator token (the curator's admin token, the modeler's token) a service accepts from its
#: settings: the failed-token lock-out never blocks the operator token (``servicekit.asgi_guards``), so its
#: strength is what stops guessing. Generated tokens have 43 characters (256 bits).
MIN_OPERATOR_TOKEN_LENGTH = 24


def check_operator_token(token: SecretStr | None, variable: str) -> SecretStr | None:
    """The configured operator token, if long enough (None: generated at first start)."""
    if token is not None and 0 < len(token.get_secret_value()) < MIN_OPERATOR_TOKEN_LENGTH:
        raise ValueError(
            f"{variable} has {len(token.get_secret_value())} characters; use at least "
            f"{MIN_OPERATOR_TOKEN_LENGTH} random ones, e.g. the output of "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))' (or leave it unset to have one "
            "generated)"
        )
    return token


def private_data_dir(data_dir: Path, logger: logging.Logger, *, variable: str) -> None:
    """Keep what the service writes to itself: umask 077 for this process (files 0600, directories 0700;
    uvicorn's worker processes inherit it), the data dir created 0700, and a loud warning when an existing
    data dir is open to its group or to others (it holds raw rows, outcomes, tokens and keys)."""
    os.umask(0o077)
    if data_dir.exists():
        mode = stat.S_IMODE(data_dir.stat().st_mode)
        if mode & 0o077:
            logger.warning(
                "the data dir %s (%s) has mode %o: other users of this machine may read what it holds; "
                "run chmod 700 %s (new files are created 0600 whatever its mode)",
                data_dir,
                variable,
                mode,
                data_dir,
            )
    else:
        data_dir.mkdir(mode=0o700, parents=True)


def create_private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (for SQLite: its -wal and -shm files take
    the database file's mode)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


#: Values of both services' ``log_format`` setting.
LogFormat = Literal["text", "json"]

#: The JSON formatter of ``log_format = "json"`` (``shared.servicekit.logs``), as dictConfig names it.
JSON_FORMATTER = {"()": "shared.servicekit.logs.JsonFormatter"}


def configure_logging(log_format: LogFormat = "text", *, force: bool = False) -> None:
    """The services' log format on the root logger (pobo's own loggers): text lines (:data:`LOG_FORMAT`),
    or one JSON object per line (``shared.servicekit.logs``). Also called in each spawned worker, where
    uvicorn's configuration (``uvicorn_log_config``) has already set the root logger: like
    ``logging.basicConfig``, nothing changes then unless ``force``."""
    if log_format == "json":
        from shared.servicekit.logs import JsonFormatter

        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=logging.INFO, handlers=[handler], force=force)
    else:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, force=force)


class RedactQueryStrings(logging.Filter):
    """Drop the query string from uvicorn's access-log lines.

    A client that puts a credential in the URL by mistake (``?token=...``) must not find it in a log: the
    access line keeps the path and replaces whatever follows ``?`` by ``[redacted]``. pobo's own log lines
    name paths only, never query strings.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn.access: (client_addr, method, full_path, http_version, status_code)
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0] + "?[redacted]", *args[3:])
        return True


def uvicorn_log_config(log_format: LogFormat = "text") -> dict[str, Any]:
    """uvicorn's own logging configuration with :class:`RedactQueryStrings` on its access log handler.

    Handed to ``uvicorn.run`` (not installed afterwards), so that it holds in the single process, in every
    spawned worker (uvicorn configures each worker's logging from it), with or without TLS. With
    ``log_format="json"`` uvicorn's error and access lines are formatted by ``logs.JsonFormatter`` (the
    redaction filter still runs first), and so are the root logger's (pobo's own loggers, on stderr).
    """
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact_query"] = {"()": f"{__name__}.RedactQueryStrings"}
    config["handlers"]["access"].setdefault("filters", []).append("redact_query")
    if log_format == "json":
        config["formatters"] = {"default": dict(JSON_FORMATTER), "access": dict(JSON_FORMATTER)}
        config["handlers"]["pobo"] = {
            "formatter": "default",
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
        }
        config["root"] = {"handlers": ["pobo"], "level": "INFO"}
    return config


def _exit_cleanly(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def exit_after_shutdown(status: int) -> NoReturn:
    """End the process (``pobo <service> serve``, once ``serve`` has returned or raised ``SystemExit``: the
    server has shut down) as the interpreter would, but without its teardown: join the threads still running
    (non-daemon ones, which a normal exit waits for), run the exit handlers (``logging.shutdown`` flushes the
    logs), flush stdout and stderr, then ``os._exit``. What is skipped is the clearing of every loaded module
    and the garbage collection of the app's objects: about half a second of CPU per process, which every
    restart and stop would otherwise wait for."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def run(
    app: Any,
    *,
    host: str,
    port: int,
    workers: int = 1,
    factory: str | None = None,
    tls_certfile: Path | None = None,
    tls_keyfile: Path | None = None,
    tls_keyfile_password: str | None = None,
    access_log: bool = True,
    log_format: LogFormat = "text",
) -> None:
    """Serve ``app`` (one process) or, with ``workers > 1``, ``factory`` (``"module:function"``) in each
    of ``workers`` spawned processes. Returns after a graceful shutdown (SIGTERM or SIGINT); exit 0 (the
    command then ends the process with ``exit_after_shutdown``)."""
    import uvicorn

    tls = uvicorn_ssl_options(tls_certfile, tls_keyfile, tls_keyfile_password)
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": "info",
        "access_log": access_log,
        "log_config": uvicorn_log_config(log_format),
        "timeout_graceful_shutdown": 10,
        **tls,
    }
    if workers > 1:
        if factory is None:
            raise ValueError("several workers need the app factory as an import string")
        # The supervisor handles SIGTERM/SIGINT itself: it stops every worker gracefully, then returns.
        uvicorn.run(factory, factory=True, workers=workers, **options)
        return
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal with the handler that was in place
    # before it started; this one turns that into a clean exit (status 0) instead of death by signal.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    uvicorn.run(app, **options)


class ServiceSettings(Protocol):
    """What ``serve`` reads of either service's settings."""

    service: ClassVar[str]
    host: str
    port: int
    workers: int
    data_dir: Path
    tls_certfile: Path | None
    tls_keyfile: Path | None
    tls_keyfile_password: SecretStr | None
    access_log: bool
    log_format: LogFormat

    @property
    def tls_enabled(self) -> bool: ...


def serve(
    settings: ServiceSettings,
    bind_to: tuple[str | None, int | None, int | None],
    *,
    single_app: Callable[[], Any],
    before_workers: Callable[[], object],
) -> None:
    """``pobo <service> serve``: one process (``single_app()`` builds the app, start-up work included), or
    ``before_workers()`` (the start-up work) once, then ``workers`` processes, each building the app with
    ``<service>_service.main:worker_app``. ``bind_to`` is the command line's (host, port, workers); None
    takes the setting."""
    service = settings.service
    if settings.log_format != "text":  # before anything is logged (``configure_logging`` ran with text)
        configure_logging(settings.log_format, force=True)
    logger = logging.getLogger(f"pobo.{service}")
    factory = f"{service}_service.main:worker_app"
    host, port, workers = bind_to
    bind = host or settings.host
    n_workers = workers if workers is not None else settings.workers
    private_data_dir(settings.data_dir, logger, variable=f"POBO_{service.upper()}_DATA_DIR")
    prefix = f"POBO_{service.upper()}_"
    warn_if_plaintext(logger, bind, tls=settings.tls_enabled, service=service, prefix=prefix)
    if n_workers > 1:
        before_workers()
        app = None
    else:
        app = single_app()
    password = settings.tls_keyfile_password
    run(
        app,
        factory=factory,
        workers=n_workers,
        host=bind,
        port=port if port is not None else settings.port,
        tls_certfile=settings.tls_certfile,
        tls_keyfile=settings.tls_keyfile,
        tls_keyfile_password=password.get_secret_value() if password else None,
        access_log=settings.access_log,
        log_format=settings.log_format,
    )
