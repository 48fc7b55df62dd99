"""Charts as inline SVG, drawn on the server: no plotting library and no script in the page.

`chart(series, ...)` draws named series of (x, y) points as lines or dots on shared axes
with a legend; `x_labels` turns a categorical axis's positions into names. Every text
that reaches the page is escaped.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 560, 240
LEFT, RIGHT, TOP, BOTTOM = 58, 12, 14, 40
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")


def _ticks(low: float, high: float, n: int = 5) -> list[float]:
    if high <= low:
        return [low]
    raw = (high - low) / n
    if not (math.isfinite(raw) and raw > 1e-300):  # no round steps that fine: the ends
        return [low, high]
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * step:
            step *= m
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _scale(values: Sequence[float]) -> float:
    """A power of two that brings values whose differences overflow (1e308 and -1e308)
    within range; 1 for the rest. Exact: only exponents change."""
    top = max((abs(v) for v in values), default=0.0)
    return 2.0 ** -16 if top > 1e300 else 1.0


def _span(low: float, high: float) -> tuple[float, float]:
    """An axis that shows [low, high]: widened when too narrow to draw (one value, or two
    a few ulps apart, as 0 and 5e-324), by a tenth of the value or 0.5."""
    if high - low > max(abs(low), abs(high)) * 1e-12 and high - low > 1e-290:
        return low, high
    mid = low / 2 + high / 2
    half = abs(mid) * 0.1 if abs(mid) > 1e-290 else 0.5
    return mid - half, mid + half


def _unlog(t: float) -> float:
    return 10.0 ** t


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"


def chart(series: Mapping[str, Sequence[tuple[float, float]]], *, title: str,
          x_title: str, y_title: str, dots: Sequence[str] = (), log_x: bool = False,
          x_labels: Mapping[float, str] | None = None, css_class: str = "chart") -> str:
    """An SVG chart of each named series (drawn in order, colours cycled): a line, or
    dots for the series named in `dots`."""
    points = [(x, y) for pts in series.values() for x, y in pts
              if math.isfinite(x) and math.isfinite(y) and (not log_x or x > 0)]
    head = (f'<svg class="{escape(css_class)}" xmlns="http://www.w3.org/2000/svg" '
            f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{escape(title)}"><title>{escape(title)}</title>')
    if not points:
        return (head + f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" '
                f'fill="#777">no data yet</text></svg>')

    def fx(x: float) -> float:
        return math.log10(x) if log_x else x

    # Values are drawn scaled (kx, ky: powers of two) so that no span overflows.
    kx, ky = _scale([fx(x) for x, _ in points]), _scale([y for _, y in points])
    xs, ys = [fx(x) * kx for x, _ in points], [y * ky for _, y in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x_labels:  # categories sit half a step in from the edges
        x0, x1 = min(x_labels) - 0.5, max(x_labels) + 0.5
    elif x1 == x0:
        x0, x1 = (x0 - 0.5, x1 + 0.5) if x0 - 0.5 < x0 < x1 + 0.5 else _span(x0, x1)
    else:
        x0, x1 = _span(x0, x1)
        if dots:
            x0, x1 = x0 - (x1 - x0) * 0.04, x1 + (x1 - x0) * 0.04
    y0, y1 = _span(y0, y1)
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad * (2 + 3 * len(series))  # room for the legend
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(s: float) -> float:  # a scaled x (a log for log_x) to its place
        return LEFT + (s - x0) / (x1 - x0) * plot_w

    def sy(s: float) -> float:
        return TOP + (1 - (s - y0) / (y1 - y0)) * plot_h

    def px(x: float) -> float:
        return sx(fx(x) * kx)

    def py(y: float) -> float:
        return sy(y * ky)

    out = [head, f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" '
                 'fill="#fff" stroke="#bbb"/>']
    for t in _ticks(y0, y1):
        if math.isfinite(t / ky):  # a tick in the legend's room may lie past float's end
            out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{sy(t):.1f}" '
                       f'y2="{sy(t):.1f}" stroke="#eee"/><text x="{LEFT - 4}" '
                       f'y="{sy(t) + 4:.1f}" text-anchor="end" font-size="11">'
                       f'{_fmt(t / ky)}</text>')
    if x_labels:
        x_ticks = [(fx(x) * kx, label) for x, label in x_labels.items()]
    else:
        x_ticks = [(t, _fmt(_unlog(t / kx) if log_x else t / kx))
                   for t in _ticks(x0, x1) if math.isfinite(t / kx)
                   and (not log_x or t / kx < 308)]
    for at, label in x_ticks:
        out.append(f'<text x="{sx(at):.1f}" y="{TOP + plot_h + 15}" text-anchor="middle" '
                   f'font-size="11">{escape(label)}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle" '
               f'font-size="12">{escape(x_title)}</text>')
    out.append(f'<text x="12" y="{TOP + plot_h / 2}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 12 {TOP + plot_h / 2})">{escape(y_title)}</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        good = [(px(x), py(y)) for x, y in pts
                if math.isfinite(x) and math.isfinite(y) and (not log_x or x > 0)]
        if name not in dots and len(good) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in good)
            out.append(f'<polyline class="series" data-name="{escape(name)}" fill="none" '
                       f'stroke="{color}" stroke-width="1.5" points="{path}"/>')
        else:
            out.append(f'<g class="series" data-name="{escape(name)}" fill="{color}">' +
                       "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5"/>'
                               for x, y in good) + "</g>")
        out.append(f'<text x="{LEFT + 6}" y="{TOP + 13 + 13 * i}" font-size="11" '
                   f'fill="{color}">{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)
