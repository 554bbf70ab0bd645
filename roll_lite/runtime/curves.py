"""curves.svg: a run's metrics over its steps, one small chart per metric, two to a row.

Drawn here as SVG text rather than with a plotting library: matplotlib's import and PNG rendering cost
every run about a second of CPU at its end, and an SVG opens in any browser or editor.

    write_curves(run_dir / "curves.svg", {"reward/mean": [(1, 0.1), (2, 0.3)], ...})
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

WIDTH, HEIGHT = 460, 210  # one chart
LEFT, RIGHT, TOP, BOTTOM = 70, 15, 30, 35  # its plot area's margins: room for the labels
COLUMNS = 2


def write_curves(path: Path, series: dict[str, list[tuple[int, float]]]) -> Path | None:
    """One chart per name with at least one finite value; None when there is nothing to draw."""
    charts = {name: [(x, y) for x, y in points if math.isfinite(y)] for name, points in series.items()}
    charts = {name: points for name, points in charts.items() if points}
    if not charts:
        return None
    rows = math.ceil(len(charts) / COLUMNS)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH * COLUMNS}" height="{HEIGHT * rows}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH * COLUMNS}" height="{HEIGHT * rows}" fill="white"/>',
    ]
    for index, (name, points) in enumerate(charts.items()):
        parts.append(_chart(name, points, (index % COLUMNS) * WIDTH, (index // COLUMNS) * HEIGHT))
    parts.append("</svg>\n")
    path.write_text("\n".join(parts))
    return path


def _chart(name: str, points: list[tuple[int, float]], x0: int, y0: int) -> str:
    xs, ys = [x for x, _ in points], [y for _, y in points]
    x_lo, x_hi = _span(min(xs), max(xs))
    y_lo, y_hi = _span(min(ys), max(ys))
    left, right, top, bottom = x0 + LEFT, x0 + WIDTH - RIGHT, y0 + TOP, y0 + HEIGHT - BOTTOM

    pixels = [
        (
            left + (x - x_lo) / (x_hi - x_lo) * (right - left),
            bottom - (y - y_lo) / (y_hi - y_lo) * (bottom - top),
        )
        for x, y in points
    ]
    line = " ".join(f"{px:.1f},{py:.1f}" for px, py in pixels)
    marks = "".join(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5"/>' for px, py in pixels)
    return "\n".join(
        [
            f'<text x="{(left + right) / 2:.0f}" y="{y0 + 18}" text-anchor="middle" font-size="13">{escape(name)}</text>',
            f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" stroke="#999"/>',
            f'<text x="{left - 5}" y="{top + 4}" text-anchor="end">{_label(y_hi)}</text>',
            f'<text x="{left - 5}" y="{bottom}" text-anchor="end">{_label(y_lo)}</text>',
            f'<text x="{left}" y="{bottom + 15}" text-anchor="middle">{_label(x_lo)}</text>',
            f'<text x="{right}" y="{bottom + 15}" text-anchor="middle">{_label(x_hi)}</text>',
            f'<text x="{(left + right) / 2:.0f}" y="{bottom + 28}" text-anchor="middle">step</text>',
            f'<polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>',
            f'<g fill="#1f77b4">{marks}</g>' if len(points) < 30 else "",
        ]
    )


def _span(lo: float, hi: float) -> tuple[float, float]:
    """The axis range: [lo, hi], widened around a single value so that it has a width."""
    if hi > lo:
        return lo, hi
    pad = abs(lo) * 0.05 or 0.5
    return lo - pad, hi + pad


def _label(value: float) -> str:
    return f"{value:.4g}"
