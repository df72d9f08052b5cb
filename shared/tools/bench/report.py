"""What every ``pobo bench ...`` command does with its results: a rich table on the terminal, a Markdown
copy, and the JSON report written atomically (temp name, then rename) beside it."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from shared.files import write_json_atomic, write_text_atomic

__all__ = ["markdown_table", "rich_table", "write_report"]


def rich_table(
    title: str, header: Sequence[str], rows: Sequence[Sequence[str]], *, left: Collection[str]
) -> Any:
    """A rich Table: the columns named in ``left`` left-aligned, the numbers right-aligned."""
    from rich.table import Table

    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="left" if h in left else "right")
    for row in rows:
        table.add_row(*row)
    return table


def markdown_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [f"# {title}", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], json_path: Path, markdown: str) -> None:
    """``report`` as JSON at ``json_path`` (atomically) and ``markdown`` beside it (``.md``)."""
    write_json_atomic(json_path, report)
    write_text_atomic(json_path.with_suffix(".md"), markdown)
