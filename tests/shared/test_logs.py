"""JSON logs (setting ``log_format = "json"``, issue 35): every line uvicorn's error and access loggers and
pobo's own loggers print is one JSON object with fixed fields; no query string, no bearer token, no value
passed to a logger besides its message."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from shared.servicekit.logs import JsonFormatter, redact
from shared.servicekit.serving import RedactQueryStrings, configure_logging, uvicorn_log_config

SECRET = "s3cret-token-0123456789abcdefghijklmnop"
LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "curator_service", "pobo.curator")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Put every logger these tests configure back as it was (pytest's own capture included)."""
    saved = []
    for name in LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, list(logger.handlers), logger.level, logger.propagate, logger.disabled))
    yield
    for logger, handlers, level, propagate, disabled in saved:
        for handler in list(logger.handlers):
            if handler not in handlers:
                logger.removeHandler(handler)
        for handler in handlers:
            if handler not in logger.handlers:
                logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate, logger.disabled = propagate, disabled


def json_config(out: io.StringIO, err: io.StringIO) -> dict[str, Any]:
    """The services' JSON log configuration, its streams replaced by buffers."""
    config = uvicorn_log_config("json")
    config["handlers"]["default"]["stream"] = err
    config["handlers"]["pobo"]["stream"] = err
    config["handlers"]["access"]["stream"] = out
    return config


def parse(*buffers: io.StringIO) -> list[dict[str, Any]]:
    """Every line of the buffers, each of which must be one JSON object with the common fields."""
    entries = []
    for buffer in buffers:
        for line in buffer.getvalue().splitlines():
            entry = json.loads(line)
            assert isinstance(entry, dict)
            assert {"time", "level", "logger", "message", "pid"} <= set(entry), entry
            assert entry["time"].endswith("Z") and "T" in entry["time"]
            entries.append(entry)
    return entries


def test_every_line_is_one_json_object_without_secrets() -> None:
    out, err = io.StringIO(), io.StringIO()
    logging.config.dictConfig(json_config(out, err))
    # exactly uvicorn's access call (uvicorn/protocols/http/h11_impl.py)
    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d', "127.0.0.1:50000", "GET", f"/v1/datasets?token={SECRET}", "1.1", 200
    )
    logging.getLogger("uvicorn.error").info("Started server process [%d]", 42)
    try:
        raise RuntimeError(f"bad header Authorization: Bearer {SECRET}")
    except RuntimeError:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    logging.getLogger("curator_service").warning("two\nlines for %s", "dataset 3", extra={"raw": 3.14159})
    logging.getLogger("pobo.curator").info("token Bearer %s", SECRET)

    text = out.getvalue() + err.getvalue()
    assert SECRET not in text and "token=" not in text and "3.14159" not in text
    access, started, failed, pobo, token = parse(out, err)
    assert access["logger"] == "uvicorn.access" and access["level"] == "INFO"
    assert (access["method"], access["path"], access["status"]) == ("GET", "/v1/datasets?[redacted]", 200)
    assert started["message"] == "Started server process [42]" and "method" not in started
    assert failed["level"] == "ERROR" and "exc" in failed
    assert "RuntimeError" in failed["exc"] and "Bearer [redacted]" in failed["exc"]
    assert pobo == pobo | {
        "logger": "curator_service",
        "level": "WARNING",
        "message": "two\nlines for dataset 3",
    }
    assert "raw" not in pobo
    assert token["message"] == "token Bearer [redacted]"


def test_the_access_filter_still_runs_before_the_formatter() -> None:
    config = uvicorn_log_config("json")
    assert "redact_query" in config["handlers"]["access"]["filters"]
    assert config["formatters"]["access"] == {"()": "shared.servicekit.logs.JsonFormatter"}
    assert config["root"]["handlers"] == ["pobo"]
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "%s %s %s %s %d", None, None)
    record.args = ("1.2.3.4:5", "POST", f"/v1/x?a={SECRET}", "1.1", 201)
    assert RedactQueryStrings().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["path"] == "/v1/x?[redacted]" and SECRET not in line["message"]


def test_text_stays_the_default() -> None:
    config = uvicorn_log_config()
    assert "root" not in config and "pobo" not in config["handlers"]
    assert config["formatters"]["access"]["()"] == "uvicorn.logging.AccessFormatter"
    assert redact("Authorization: bearer abc.def-1") == "Authorization: bearer [redacted]"
    assert (
        redact('GET https://c.example/v1/q?wait=30&k=v "200"')
        == 'GET https://c.example/v1/q?[redacted] "200"'
    )
    assert redact("is it done? yes") == "is it done? yes"


def test_configure_logging_json_sets_the_root_logger() -> None:
    configure_logging("json", force=True)
    (handler,) = logging.getLogger().handlers
    assert isinstance(handler.formatter, JsonFormatter)
    buffer = io.StringIO()
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(buffer)
    logging.getLogger("pobo.curator").warning("the data dir %s has mode %o", "/data", 0o755)
    (entry,) = parse(buffer)
    assert entry["message"] == "the data dir /data has mode 755" and entry["logger"] == "pobo.curator"


def test_a_real_uvicorn_server_logs_json(tmp_path: Path) -> None:
    import uvicorn

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/boom":
            raise RuntimeError(f"failed with Authorization: Bearer {SECRET}")
        logging.getLogger("curator_service").info("served %s", scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    out, err = io.StringIO(), io.StringIO()
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=json_config(out, err), access_log=True)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.025)
        port = server.servers[0].sockets[0].getsockname()[1]
        headers = {"Authorization": f"Bearer {SECRET}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:
            assert client.get("/v1/datasets", params={"token": SECRET}).status_code == 200
            assert client.get("/boom").status_code == 500
    finally:
        server.should_exit = True
        thread.join(10)
    text = out.getvalue() + err.getvalue()
    assert SECRET not in text and "token=" not in text
    entries = parse(out, err)
    access = [e for e in entries if e["logger"] == "uvicorn.access"]
    assert [(e["method"], e["path"], e["status"]) for e in access] == [
        ("GET", "/v1/datasets?[redacted]", 200),
        ("GET", "/boom", 500),
    ]
    assert any(e["logger"] == "curator_service" and e["message"] == "served /v1/datasets" for e in entries)
    (failure,) = [e for e in entries if "exc" in e]
    assert failure["logger"] == "uvicorn.error" and "Bearer [redacted]" in failure["exc"]
    assert any(e["message"].startswith("Uvicorn running on") for e in entries)


def test_the_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any, caplog: Any) -> None:
    from curator_service.config import Settings as CuratorSettings
    from modeler_service.config import Settings as ModelerSettings

    monkeypatch.setenv("POBO_MODELER_LOG_FORMAT", "json")
    assert ModelerSettings().log_format == "json"
    assert CuratorSettings().log_format == "text"
    monkeypatch.setenv("POBO_CURATOR_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError):
        CuratorSettings()
    monkeypatch.setenv("POBO_CURATOR_LOG_FORMAT", "json")
    settings = CuratorSettings(data_dir=tmp_path)
    with caplog.at_level(logging.INFO):
        token = settings.resolve_admin_token().get_secret_value()
    printed = capsys.readouterr()
    assert token not in printed.out + printed.err + caplog.text  # a JSON log never carries the token
    assert f"saved to {tmp_path / 'admin-token'}" in caplog.text
