"""Small SVG charts of reward histograms: the W&B panels of CoMLRL 1.4.3's
``log_reward_distribution=True`` (one round's current-policy ("target") and comparator
rewards, binned over the reward function's declared ``reward_range``).

:func:`reward_chart_svg` draws one chart as an SVG document in a ``<div>``: a line chart
(one polyline per series through the bin centres) or a grouped bar chart (one bar per
series in each bin). Geometry, colours and labels follow 1.4.3's panels so that its tests
(and dashboards built on them) read the same: a 240 x 80 canvas, the plot area from
x = 29 to 230 and y = 14 (the highest count) to 62 (zero), ``target`` in orange
(``#e87030``), ``comparator`` in grey, any other series in blue (``#2878d6``), axes in
``#505050`` drawn over the bars and under the lines. The caller wraps the text for W&B
(``wandb.Html``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

import numpy as np

__all__ = ["SERIES_COLORS", "reward_chart_svg", "tick_label"]

#: the colour of each named series; any other name is drawn in :data:`OTHER_COLOR`
SERIES_COLORS = {"target": "#e87030", "comparator": "#6e6e6e"}
OTHER_COLOR = "#2878d6"
AXIS_COLOR = "#505050"
GRID_COLOR = "#dddddd"
LABEL_COLOR = "#4d4d4d"
BAR_OPACITY = "0.82"
FONT = 'font-family="Arial, sans-serif"'


def tick_label(value: float) -> str:
    """An axis tick's text: an integer bare (``2``), else one, two or three decimals for
    ``|value| >= 1``, ``>= 0.1`` or below (``1.5``, ``0.25``, ``0.050``)."""
    if abs(value - round(value)) < 1e-9:
        return str(int(round(value)))
    digits = 1 if abs(value) >= 1.0 else 2 if abs(value) >= 0.1 else 3
    return f"{value:.{digits}f}"


def _text(value: Any) -> str:
    """``value`` as XML character data or attribute text (``&``, ``<``, ``>``, ``"``)."""
    return escape(str(value), {'"': "&quot;"})


@dataclass(frozen=True)
class _Frame:
    """The canvas and plot area (pixels) and the data range they map."""

    low: float  # reward at the left edge of the plot area
    span: float  # reward range across it (> 0)
    peak: float  # count at the top of the plot area (>= 1)
    width: int = 240
    height: int = 80
    left: int = 29
    right: int = 230
    top: int = 14
    bottom: int = 62

    def x(self, reward: float) -> float:
        return self.left + (float(reward) - self.low) / self.span * (self.right - self.left)

    def bar_height(self, count: float) -> float:
        return float(count) / self.peak * (self.bottom - self.top)

    def y(self, count: float) -> float:
        return self.bottom - self.bar_height(count)


def _grid_and_ticks(frame: _Frame, edges: np.ndarray) -> list[str]:
    """Light grid lines with their labels: five reward ticks across, five count ticks up."""
    out = []
    for reward in np.linspace(float(edges[0]), float(edges[-1]), 5):
        x = round(frame.x(reward))
        out.append(
            f'<line x1="{x}" y1="{frame.top}" x2="{x}" y2="{frame.bottom}" '
            f'stroke="{GRID_COLOR}" stroke-width="1"/>'
            f'<text x="{x}" y="{frame.bottom + 8}" font-size="5.5" {FONT} '
            f'text-anchor="middle" fill="{LABEL_COLOR}">{tick_label(float(reward))}</text>'
        )
    for count in np.linspace(0.0, frame.peak, 5):
        y = round(frame.y(count))
        out.append(
            f'<line x1="{frame.left}" y1="{y}" x2="{frame.right}" y2="{y}" '
            f'stroke="{GRID_COLOR}" stroke-width="1"/>'
            f'<text x="{frame.left - 4}" y="{y + 2}" font-size="6" {FONT} '
            f'text-anchor="end" fill="{LABEL_COLOR}">{tick_label(float(count))}</text>'
        )
    return out


def _axes(frame: _Frame) -> list[str]:
    """The two axis lines and their titles (``reward`` across, ``count`` up)."""
    mid_x = (frame.left + frame.right) / 2
    mid_y = (frame.top + frame.bottom) / 2
    return [
        f'<line x1="{frame.left}" y1="{frame.bottom}" x2="{frame.right}" y2="{frame.bottom}" '
        f'stroke="{AXIS_COLOR}" stroke-width="1"/>',
        f'<line x1="{frame.left}" y1="{frame.top}" x2="{frame.left}" y2="{frame.bottom}" '
        f'stroke="{AXIS_COLOR}" stroke-width="1"/>',
        f'<text x="{mid_x:.1f}" y="{frame.height - 3}" font-size="5.5" {FONT} '
        'text-anchor="middle">reward</text>',
        f'<text x="7" y="{mid_y:.1f}" font-size="5.5" {FONT} text-anchor="middle" '
        f'transform="rotate(-90 7 {mid_y:.1f})">count</text>',
    ]


def _legend(frame: _Frame, labels: Sequence[str], kind: str) -> list[str]:
    """One row per series at the top right: a stroke (line chart) or swatch (bars)."""
    out = []
    x = frame.right - 52
    for row, label in enumerate(labels):
        y = frame.top + 7 + 8 * row
        color = SERIES_COLORS.get(label, OTHER_COLOR)
        if kind == "line":
            mark = (
                f'<line x1="{x}" y1="{y}" x2="{x + 13}" y2="{y}" stroke="{color}" '
                'stroke-width="1.25" stroke-linecap="round"/>'
            )
        else:
            mark = (
                f'<rect x="{x}" y="{y - 4}" width="12" height="5" fill="{color}" '
                f'opacity="{BAR_OPACITY}"/>'
            )
        out.append(
            mark + f'<text x="{x + 16}" y="{y + 2}" font-size="6" {FONT}>{_text(label)}</text>'
        )
    return out


def _lines(frame: _Frame, edges: np.ndarray, series: Sequence[tuple[str, np.ndarray]]) -> list[str]:
    """A polyline with a dot per bin centre for each series."""
    centres = (edges[:-1] + edges[1:]) / 2.0
    out = []
    for label, counts in series:
        color = SERIES_COLORS.get(label, OTHER_COLOR)
        points = [
            (round(frame.x(c)), round(frame.y(n)))
            for c, n in zip(centres.tolist(), counts.tolist(), strict=False)
        ]
        joined = " ".join(f"{x},{y}" for x, y in points)
        out.append(
            f'<polyline points="{joined}" fill="none" stroke="{color}" stroke-width="1.25" '
            'stroke-linejoin="round" stroke-linecap="round"/>'
        )
        out.extend(f'<circle cx="{x}" cy="{y}" r="1.4" fill="{color}"/>' for x, y in points)
    return out


def _bars(frame: _Frame, edges: np.ndarray, series: Sequence[tuple[str, np.ndarray]]) -> list[str]:
    """Each bin holds the series' bars side by side over its middle 76 %."""
    out = []
    for b in range(len(edges) - 1):
        left, right = frame.x(edges[b]), frame.x(edges[b + 1])
        slot = max(right - left, 1.0)
        bar = 0.76 * slot / len(series)
        for i, (label, counts) in enumerate(series):
            height = max(frame.bar_height(float(counts[b])), 0.0)
            out.append(
                f'<rect x="{left + 0.12 * slot + i * bar:.1f}" y="{frame.bottom - height:.1f}" '
                f'width="{max(bar - 0.5, 0.5):.1f}" height="{height:.1f}" '
                f'fill="{SERIES_COLORS.get(label, OTHER_COLOR)}" opacity="{BAR_OPACITY}"/>'
            )
    return out


def reward_chart_svg(
    *, title: str, edges: np.ndarray, series: Sequence[tuple[str, np.ndarray]], kind: str
) -> str | None:
    """One reward histogram chart as SVG text (in a ``<div>``), or None when there is
    nothing to draw.

    Args:
        title: shown at the top (escaped).
        edges: ``B + 1`` increasing bin edges (reward units).
        series: ``(label, counts)`` pairs, ``counts`` of length ``B`` (or empty: the
            series is left out, legend included).
        kind: ``"line"`` (a polyline through the bin centres per series) or ``"bar"``
            (grouped bars).

    Returns:
        The markup; None for no series at all, or a bar chart whose series are all empty
        (a line chart then still draws its empty frame).

    Raises:
        ValueError: ``kind`` is neither ``"line"`` nor ``"bar"``, fewer than two edges, or
            a series whose counts do not have one value per bin.
    """
    if kind not in ("line", "bar"):
        raise ValueError(f"kind must be 'line' or 'bar', got {kind!r}")
    edges = np.asarray(edges, dtype=float)
    if edges.ndim != 1 or len(edges) < 2:
        raise ValueError(f"edges must be at least two bin edges, got {edges!r}")
    if not series:
        return None
    drawn = [(str(label), np.asarray(c, dtype=float)) for label, c in series if len(c) > 0]
    for label, counts in drawn:
        if len(counts) != len(edges) - 1:
            raise ValueError(f"series {label!r} has {len(counts)} counts for {len(edges) - 1} bins")
    if kind == "bar" and not drawn:
        return None
    peak = max([1.0, *(float(c.max()) for _, c in drawn)])
    frame = _Frame(low=float(edges[0]), span=max(float(edges[-1] - edges[0]), 1e-12), peak=peak)
    parts = [
        f'<div style="max-width:{frame.width}px;width:100%;overflow:hidden;">',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{frame.width}" '
        f'height="{frame.height}" viewBox="0 0 {frame.width} {frame.height}" '
        'style="display:block;max-width:100%;height:auto;">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{frame.left}" y="9" font-size="7" {FONT} font-weight="700">'
        f"{_text(title)}</text>",
        *_grid_and_ticks(frame, edges),
    ]
    if kind == "line":  # lines over the axes
        parts += _axes(frame) + _lines(frame, edges, drawn)
    else:  # axes over the bars
        parts += _bars(frame, edges, drawn) + _axes(frame)
    parts += _legend(frame, [label for label, _ in drawn], kind)
    parts.append("</svg></div>")
    return "".join(parts)
