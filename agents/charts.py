"""The run page's chart of trials, drawn on the server as SVG: it needs no script, weighs a
few kilobytes, and is re-sent with the page's other live parts.

Each trial the tuner measured is a point at its objective (the goal metric of the candidate
over the base's, oriented so that lower is better: 0.9 is 10% better); the line is the best so
far; the dashed line is the base (1.0). A trial that failed or was refused is a cross on the
axis, so the count of attempts shows too.
"""

from __future__ import annotations

from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 14, 42  # room for the axes' numbers and titles


def trial_points(trials: list[dict[str, Any]]) -> list[tuple[int, float | None]]:
    """(trial number, objective or None when it has none) of every finished trial."""
    points: list[tuple[int, float | None]] = []
    for trial in trials:
        value = trial.get("objective")
        if isinstance(value, int | float) and value > 0:
            points.append((int(trial.get("number", len(points) + 1)), float(value)))
        elif trial.get("failed"):
            points.append((int(trial.get("number", len(points) + 1)), None))
    return points


def trials_svg(trials: list[dict[str, Any]]) -> SafeString:
    points = trial_points(trials)
    if not points:
        return SafeString("")
    values = [v for _, v in points if v is not None] + [1.0]
    low, high = min(values), max(values)
    pad = max((high - low) * 0.1, 0.02)
    low, high = low - pad, high + pad
    last = max(n for n, _ in points)

    def x(number: float) -> float:
        return LEFT + (number - 0.5) / last * (WIDTH - LEFT - RIGHT)

    def y(value: float) -> float:
        return TOP + (high - value) / (high - low) * (HEIGHT - TOP - BOTTOM)

    parts = [f'<svg class="trials" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'aria-label="objective of each trial and the best so far">',
             f'<line class="axis" x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" '
             f'y2="{HEIGHT - BOTTOM}"/>',
             f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}"/>',
             f'<line class="base" x1="{LEFT}" y1="{y(1.0):.1f}" x2="{WIDTH - RIGHT}" '
             f'y2="{y(1.0):.1f}"/>',
             f'<text class="label" x="{WIDTH - RIGHT}" y="{y(1.0) - 4:.1f}" '
             f'text-anchor="end">base 1.0</text>']
    for tick in sorted({low + pad, 1.0, high - pad}):
        parts.append(f'<text class="tick" x="{LEFT - 6}" y="{y(tick) + 4:.1f}" '
                     f'text-anchor="end">{tick:.3g}</text>')
    step = max(1, round(last / 10))
    for number in range(1, last + 1, step):
        parts.append(f'<text class="tick" x="{x(number):.1f}" y="{HEIGHT - BOTTOM + 16}" '
                     f'text-anchor="middle">{number}</text>')
    parts.append(f'<text class="title" x="{(LEFT + WIDTH - RIGHT) / 2:.1f}" y="{HEIGHT - 4}" '
                 'text-anchor="middle">trial</text>')
    middle = -(TOP + HEIGHT - BOTTOM) / 2
    parts.append(f'<text class="title" transform="rotate(-90)" x="{middle:.1f}" y="14" '
                 'text-anchor="middle">candidate ÷ base (lower is better)</text>')
    best: float | None = None
    line = []
    for number, value in points:
        if value is None:
            cx, cy = x(number), HEIGHT - BOTTOM
            parts.append(f'<path class="failed" d="M{cx - 4:.1f},{cy - 4} l8,8 m0,-8 l-8,8">'
                         f'<title>trial {number}: no measurement</title></path>')
            continue
        best = value if best is None else min(best, value)
        line.append(f"{x(number):.1f},{y(best):.1f}")
        parts.append(f'<circle class="trial" cx="{x(number):.1f}" cy="{y(value):.1f}" r="4">'
                     f"<title>trial {number}: {escape(f'{value:.4g}')}</title></circle>")
    if line:
        parts.insert(5, f'<polyline class="best" points="{" ".join(line)}"/>')
    parts.append("</svg>")
    # Only numbers and fixed words above; the one formatted value is escaped.
    return mark_safe("".join(parts))  # noqa: S308  # nosec B308
