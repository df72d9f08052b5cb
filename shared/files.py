"""Whole-file writes that never leave a half-written file: a temporary file beside the target, then a rename
(``os.replace`` is atomic on POSIX and Windows). Used by the tools for their reports, plots and docs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_json_atomic", "write_text_atomic"]


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` (UTF-8) at ``path``: readers see the old file or the new one, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json_atomic(path: Path, data: Any) -> None:
    """``data`` as indented JSON at ``path`` (``write_text_atomic``)."""
    write_text_atomic(path, json.dumps(data, indent=1))
