"""The console's charts, drawn on the server with matplotlib as SVG (the pages load them as images: no
chart script, nothing for the Content-Security-Policy to allow)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib is imported by the first chart drawn (a service starts without it)
    from matplotlib.figure import Figure

__all__ = ["Bar", "Series", "budget_chart", "line_chart", "SVG_MEDIA_TYPE"]

SVG_MEDIA_TYPE = "image/svg+xml"
_COLORS = ["#2357c6", "#c65b23", "#1f7a46", "#8a2be2", "#b3261e", "#0f6e6e"]


@dataclass(frozen=True)
class Series:
    """One line: ``x`` and ``y`` of equal length; ``step``: drawn as a step function (best so far)."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    step: bool = False
    markers: bool = False


@dataclass(frozen=True)
class Bar:
    """One row of a budget chart: ``spent`` of ``total`` (the rest is left)."""

    label: str
    spent: float
    total: float


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure  # (no pyplot: no global state, no GUI backend)

    return Figure(figsize=(width, height), dpi=100)


def _svg(fig: Figure) -> bytes:
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()


def line_chart(
    series: Sequence[Series], *, title: str, xlabel: str, ylabel: str, empty: str = "no data yet"
) -> bytes:
    """Lines over a shared x axis (SVG bytes)."""
    fig = _figure(7.2, 3.6)
    ax = fig.add_subplot()
    drawn = [s for s in series if len(s.x)]
    for k, s in enumerate(drawn):
        color = _COLORS[k % len(_COLORS)]
        if s.step:
            ax.step(s.x, s.y, where="post", lw=2, color=color, label=s.label)
        else:
            ax.plot(s.x, s.y, lw=1.6, color=color, label=s.label, marker="o" if s.markers else None, ms=3)
    if drawn:
        ax.legend(loc="best", fontsize="small")
    else:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, color="#5d6778")
    ax.set_title(title, fontsize="medium")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return _svg(fig)


def budget_chart(bars: Sequence[Bar], *, title: str, unit: str = "epsilon") -> bytes:
    """Horizontal bars: spent (dark) and left (light) of each budget; a bar past its total is red."""
    height = 1.1 + 0.45 * max(1, len(bars))
    fig = _figure(7.2, height)
    ax = fig.add_subplot()
    if not bars:
        ax.text(0.5, 0.5, "nothing spent yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return _svg(fig)
    labels = [b.label for b in bars]
    spent = [min(b.spent, b.total) if b.total > 0 else b.spent for b in bars]
    left = [max(b.total - b.spent, 0.0) for b in bars]
    over = [b.total > 0 and b.spent > b.total for b in bars]
    rows = range(len(bars))
    ax.barh(rows, spent, color=["#b3261e" if o else "#2357c6" for o in over], label="spent")
    ax.barh(rows, left, left=spent, color="#c9d6f2", label="left")
    for i, b in enumerate(bars):
        text = f"{b.spent:.3g} of {b.total:.3g}" if b.total > 0 else f"{b.spent:.3g}"
        ax.text(b.spent + left[i], i, "  " + text, va="center", fontsize="small")
    ax.set_yticks(list(rows), labels)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_xlim(0, max(max(b.total, b.spent) for b in bars) * 1.35 or 1.0)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small", frameon=False)
    ax.set_title(title, fontsize="medium")
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)
