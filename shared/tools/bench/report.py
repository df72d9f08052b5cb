"""What every ``pobo bench ...`` command does with its results: a rich table on the terminal, a Markdown
copy, and the JSON report written atomically (temp name, then rename) beside it, and an optional plot.

``bench_main`` is the skeleton of a benchmark's ``main``: run under a progress bar, complete the report,
print it, write it (``publish``), plot it. A benchmark that times its phases under ``console.status``
instead runs them itself and ends with ``publish``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shared.files import write_json_atomic, write_text_atomic

__all__ = [
    "bench_main",
    "markdown_table",
    "progress",
    "publish",
    "rich_table",
    "save_figure",
    "write_report",
]

Report = dict[str, Any]


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


def write_report(report: Report, json_path: Path, markdown: str) -> None:
    """``report`` as JSON at ``json_path`` (atomically) and ``markdown`` beside it (``.md``)."""
    write_json_atomic(json_path, report)
    write_text_atomic(json_path.with_suffix(".md"), markdown)


def save_figure(fig: Any, path: Path) -> None:
    """Write a matplotlib figure as PNG to a temporary name, then rename (never a half-written plot)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    os.replace(tmp, path)


@contextmanager
def progress(console: Any, label: str, runs: int) -> Iterator[Callable[[], None]]:
    """A rich progress bar over ``runs``; yields the callback that advances it by one run."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(TextColumn(f"[bold]{label}[/] runs"), *columns, console=console) as bar:
        task = bar.add_task("runs", total=runs)
        yield lambda: bar.advance(task)


def publish(
    console: Any,
    report: Report,
    *,
    show: Iterable[Any],
    json_path: Path | None,
    markdown: str | None = None,
    plot: Callable[[Report, Path], None] | None = None,
    plot_path: Path | None = None,
    indent: int = 1,
    announce: bool = False,
) -> Report:
    """Print each item of ``show`` (a table, a line, ...), write ``report`` at ``json_path`` if given (with
    ``markdown`` beside it when given, ``write_report``; else the JSON alone, indented by ``indent``, and
    with ``announce`` a line saying where), draw ``plot`` at ``plot_path`` if given; returns ``report``."""
    for item in show:
        console.print(item)
    if json_path:
        if markdown is None:
            write_json_atomic(json_path, report, indent=indent)
            if announce:
                console.print(f"wrote {json_path}")
        else:
            write_report(report, json_path, markdown)
    if plot is not None and plot_path:
        plot(report, plot_path)
    return report


def bench_main(
    run: Callable[[Callable[[], None]], Report],
    *,
    label: str,
    runs: int,
    show: Callable[[Report], Iterable[Any]],
    json_path: Path | None,
    markdown: Callable[[Report], str] | None = None,
    plot: Callable[[Report, Path], None] | None = None,
    plot_path: Path | None = None,
    complete: Callable[[Report], None] | None = None,
) -> Report:
    """The ``main`` of a benchmark: ``run(advance)`` under a progress bar of ``runs`` steps labelled
    ``label``; ``complete(report)`` (more fields, once the bar is closed); then ``publish`` the items of
    ``show(report)``, the JSON (and ``markdown(report)``) at ``json_path`` and ``plot`` at ``plot_path``."""
    from rich.console import Console

    console = Console()
    with progress(console, label, runs) as advance:
        report = run(advance)
    if complete is not None:
        complete(report)
    return publish(
        console,
        report,
        show=show(report),
        json_path=json_path,
        markdown=markdown(report) if markdown is not None and json_path else None,
        plot=plot,
        plot_path=plot_path,
    )
