"""Whole-file writes that never leave a half-written file: a temporary file beside the target, then a rename
(``os.replace`` is atomic on POSIX and Windows). Used by the tools for their reports, plots and docs; and
``fsync_dir``, which makes such a rename durable, by everything that writes a file it must not lose."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["fsync_dir", "write_json_atomic", "write_text_atomic"]


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` (UTF-8) at ``path``: readers see the old file or the new one, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json_atomic(path: Path, data: Any, *, indent: int = 1) -> None:
    """``data`` as indented JSON at ``path`` (``write_text_atomic``)."""
    write_text_atomic(path, json.dumps(data, indent=indent))


def fsync_dir(path: Path) -> None:
    """fsync the directory ``path``, so that a rename (or a new file) in it survives a crash; a no-op on a
    platform without directory file descriptors."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
