"""Line charts as inline SVG text, drawn by hpcrl itself (pure: no plotting library, no network).

`hpcrl report --html` puts them in its page, so the page needs nothing but a browser: no matplotlib on
the login node, no script, no fetch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MAX_POINTS = 1200  # per line; more are thinned to each bucket's lowest and highest point
_TIME_STEPS = (
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
    172800,
    604800,
)


@dataclass(frozen=True)
class Line:
    name: str
    points: list[tuple[float, float]]
    color: str = ""
    dashed: bool = False


@dataclass(frozen=True)
class Level:
    """A horizontal reference line (a plan's figure) with its label."""

    y: float
    label: str
    color: str = "#555555"


@dataclass(frozen=True)
class Chart:
    title: str
    x_label: str
    y_label: str
    lines: list[Line]
    levels: list[Level] = field(default_factory=list)
    time_axis: bool = False  # x is epoch seconds, labelled in UTC
    x_integer: bool = False  # x counts (training steps): ticks on whole numbers only
    gap: float | None = None  # a larger step between two x's breaks the line (a monitor that was silent)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round values (1, 2 or 5 x 10^k apart) covering lo..hi."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 10))
    return ticks


def time_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    step = next((s for s in _TIME_STEPS if (hi - lo) / s <= n), _TIME_STEPS[-1])
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) // step) + 1)]


def _label(v: float) -> str:
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.1e}"
    return f"{v:,.3f}".rstrip("0").rstrip(".") if v != int(v) else f"{int(v):,}"


def _time_label(t: float, span: float) -> str:
    d = datetime.fromtimestamp(t, timezone.utc)
    return d.strftime("%H:%M" if span < 86400 else "%m-%d %H:%M")


def thin(points: list[tuple[float, float]], most: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most ~`most` points: each bucket of consecutive points keeps its lowest and highest (peaks stay)."""
    if len(points) <= most:
        return points
    size = math.ceil(len(points) / (most // 2))
    out: list[tuple[float, float]] = []
    for i in range(0, len(points), size):
        bucket = points[i : i + size]
        lo, hi = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        out += sorted({lo, hi})
    return out


def render(chart: Chart, width: int = 760, height: int = 260) -> str:
    """The chart as one <svg> element (no xmlns: HTML5 takes inline SVG as it is)."""
    lines = [
        Line(ln.name, thin(sorted(ln.points)), ln.color or PALETTE[i % len(PALETTE)], ln.dashed)
        for i, ln in enumerate(chart.lines)
        if ln.points
    ]
    xs = [x for ln in lines for x, _ in ln.points]
    ys = [y for ln in lines for _, y in ln.points] + [lv.y for lv in chart.levels]
    legend = [(ln.name, ln.color, ln.dashed) for ln in lines] + [(lv.label, lv.color, True) for lv in chart.levels]
    per_row = 3
    rows = math.ceil(len(legend) / per_row)
    left, right, top, bottom = 64, 16, 26, 40
    total_h = height + rows * 18
    pw, ph = width - left - right, height - top - bottom
    out = [
        f'<svg class="chart" viewBox="0 0 {width} {total_h}" width="{width}" height="{total_h}" role="img" '
        f'font-family="sans-serif" font-size="11">',
        f"<title>{escape(chart.title)}</title>",
        f'<text x="{left}" y="16" font-size="13" font-weight="bold">{escape(chart.title)}</text>',
    ]
    if not xs:
        out.append(f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" fill="#777">no data</text>')
        return "\n".join(out + ["</svg>"])
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    yt = nice_ticks(min(ys), max(ys))
    y0, y1 = yt[0], yt[-1]

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>')
    for t in yt:
        y = sy(t)
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{escape(_label(t))}</text>'
        )
    xt = time_ticks(x0, x1) if chart.time_axis else [t for t in nice_ticks(x0, x1, 6) if x0 <= t <= x1]
    if chart.x_integer:
        xt = [t for t in xt if t == int(t)] or sorted({float(math.ceil(x0)), float(math.floor(x1))})
    for t in xt:
        x = sx(t)
        text = _time_label(t, x1 - x0) if chart.time_axis else _label(t)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="#888"/>'
            f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">{escape(text)}</text>'
        )
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">{escape(chart.x_label)}</text>'
        f'<text x="12" y="{top + ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 12 {top + ph / 2})">{escape(chart.y_label)}</text>'
    )
    for lv in chart.levels:
        y = sy(lv.y)
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="{lv.color}" stroke-dasharray="6 4"/>'
        )
    for ln in lines:
        segments: list[list[tuple[float, float]]] = []
        for x, y in ln.points:
            if not segments or (chart.gap is not None and x - segments[-1][-1][0] > chart.gap):
                segments.append([])
            segments[-1].append((x, y))
        d = " ".join("M" + " L".join(f"{sx(x):.1f} {sy(y):.1f}" for x, y in seg) for seg in segments)
        dash = ' stroke-dasharray="6 4"' if ln.dashed else ""
        out.append(
            f'<path d="{d}" fill="none" stroke="{ln.color}" stroke-width="1.6"{dash}>'
            f"<title>{escape(ln.name)}</title></path>"
        )
        for x, y in (seg[0] for seg in segments if len(seg) == 1):  # a lone sample: a dot, not an empty path
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{ln.color}"/>')
    for i, (name, color, dashed) in enumerate(legend):
        lx, ly = left + (i % per_row) * (pw / per_row), height + 4 + (i // per_row) * 18
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        out.append(
            f'<line x1="{lx:.1f}" x2="{lx + 22:.1f}" y1="{ly:.1f}" y2="{ly:.1f}" stroke="{color}" '
            f'stroke-width="2"{dash}/><text x="{lx + 28:.1f}" y="{ly + 4:.1f}">{escape(name)}</text>'
        )
    return "\n".join(out + ["</svg>"])


__all__ = ["PALETTE", "Chart", "Level", "Line", "nice_ticks", "render", "thin", "time_ticks"]
