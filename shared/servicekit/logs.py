"""JSON log lines (the setting ``log_format = "json"``): one object per line, for a log collector.

:class:`JsonFormatter` turns every record into one line of JSON with fixed fields only::

    {"time": "2026-11-28T12:00:00.123Z", "level": "INFO", "logger": "uvicorn.access", "pid": 7,
     "message": "...", "method": "GET", "path": "/v1/datasets?[redacted]", "status": 200}

``method``, ``path`` and ``status`` are those of uvicorn's access lines; an exception is one string field,
``exc`` (its traceback, newlines escaped by JSON). A record's other attributes (``extra=``) are never
written, so what reaches the log is what the message says and nothing more: pobo's messages name ids,
paths and counts, never a data value. Two safety nets hold whatever a message says: a query string is cut
from an access line's path (as :class:`~shared.servicekit.serving.RedactQueryStrings` does on the access
handler, which runs first); a bearer token anywhere in a message or traceback, and the query string of
any http(s) URL in one (httpx logs every request the modeler makes), are replaced by ``[redacted]``.

Only the standard ``logging`` module: the formatter is named in the dictConfig that ``serving`` builds
for uvicorn (``"()": "shared.servicekit.logs.JsonFormatter"``).
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

__all__ = ["JsonFormatter", "redact"]

_BEARER = re.compile(r"(?i)\b(bearer)(\s+)[^\s\"',;]+")
_URL_QUERY = re.compile(r"(?i)(\bhttps?://[^\s?#\"']*)\?[^\s#\"']*")


def redact(text: str) -> str:
    """``text`` with every ``Bearer <token>`` replaced by ``Bearer [redacted]`` and the query string of
    every http(s) URL by ``[redacted]`` (httpx logs the URLs of the modeler's calls to the curator)."""
    return _URL_QUERY.sub(r"\1?[redacted]", _BEARER.sub(r"\1\2[redacted]", text))


def _access_fields(record: logging.LogRecord) -> dict[str, Any]:
    """method, path and status of a uvicorn access record (its query string cut, in the record's arguments
    too, so the message has none either), else nothing."""
    args = record.args
    # uvicorn.access: (client_addr, method, full_path, http_version, status_code)
    if record.name != "uvicorn.access" or not isinstance(args, tuple) or len(args) != 5:
        return {}
    method, path, status = args[1], args[2], args[4]
    if isinstance(path, str) and "?" in path:
        path = path.split("?", 1)[0] + "?[redacted]"
        record.args = (*args[:2], path, *args[3:])
    return {"method": str(method), "path": str(path), "status": status}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: time (ISO 8601, UTC), level, logger, pid, message; method,
    path and status for access lines; exc for an exception."""

    def format(self, record: logging.LogRecord) -> str:
        access = _access_fields(record)
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": redact(record.getMessage()),
        }
        entry.update(access)
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = redact(record.exc_text)
        if record.stack_info:
            entry["stack"] = redact(self.formatStack(record.stack_info))
        return json.dumps(entry, ensure_ascii=False, default=str)
