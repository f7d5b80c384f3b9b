"""The run page's chart of trials and the goal page's evolution chart, drawn on the server as
SVG: they need no script, weigh a few kilobytes, and are re-sent with a page's live parts.

Trials: each trial the tuner measured is a point at its objective (the goal metric of the
candidate over the base's, oriented so that lower is better: 0.9 is 10% better); the line is
the best so far; the dashed line is the base (1.0). A trial that failed or was refused is a
cross on the axis, so the count of attempts shows too. Any other policy's run draws its
experiments the same way (progress_svg), each at its goal metric over the base's.

Evolution: the goal metric of the base and of each merged change (agents.goals), each with its
95% interval as a bar, joined in merge order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from agents.goals import Point

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 14, 42  # room for the axes' numbers and titles
TITLE_CHARACTER = 6.6  # the mean width of a character of an axis title (12 px), in px


@dataclass
class _Plot:
    """A frame with both axes titled: x from 1 to `last`, y over [low, high] with a margin."""

    last: int
    low: float
    high: float
    x_title: str
    y_title: str
    label: str
    parts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        pad = max((self.high - self.low) * 0.1, abs(self.high) * 0.02, 1e-9)
        self.ticks = sorted({self.low, self.high})
        self.low, self.high = self.low - pad, self.high + pad
        bottom, middle = HEIGHT - BOTTOM, -(TOP + HEIGHT - BOTTOM) / 2
        self.parts += [
            f'<svg class="chart-svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{escape(self.label)}">',
            f'<line class="axis" x1="{LEFT}" y1="{bottom}" x2="{WIDTH - RIGHT}" y2="{bottom}"/>',
            f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}"/>',
            f'<text class="title" x="{(LEFT + WIDTH - RIGHT) / 2:.1f}" y="{HEIGHT - 4}" '
            f'text-anchor="middle">{escape(self.x_title)}</text>',
            f'<text class="title" transform="rotate(-90)" x="{middle:.1f}" y="14" '
            f'text-anchor="middle"{self._squeezed(self.y_title, -2 * middle)}>'
            f"{escape(self.y_title)}</text>"]
        for tick in self.ticks:
            self.parts.append(f'<text class="tick" x="{LEFT - 6}" y="{self.y(tick) + 4:.1f}" '
                              f'text-anchor="end">{tick:.3g}</text>')

    @staticmethod
    def _squeezed(title: str, room: float) -> str:
        """A title longer than the room it is centred in (a goal metric's name can be long),
        drawn narrower to fit rather than cut at the chart's edge."""
        return (f' textLength="{room:.0f}" lengthAdjust="spacingAndGlyphs"'
                if len(title) * TITLE_CHARACTER > room else "")

    def x(self, number: float) -> float:
        return LEFT + (number - 0.5) / self.last * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        return TOP + (self.high - value) / (self.high - self.low) * (HEIGHT - TOP - BOTTOM)

    def x_label(self, number: int, text: str) -> None:
        self.parts.append(f'<text class="tick" x="{self.x(number):.1f}" y="{HEIGHT - BOTTOM + 16}" '
                          f'text-anchor="middle">{escape(text)}</text>')

    def svg(self) -> SafeString:
        # Numbers, fixed words, and texts passed through escape() above.
        return mark_safe("".join(self.parts) + "</svg>")  # noqa: S308  # nosec


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
    return progress_svg([(number, value, f"trial {number}") for number, value in
                         trial_points(trials)], lower_is_better=True, x_title="trial",
                        y_title="candidate ÷ base (lower is better)",
                        label="objective of each trial and the best so far")


def progress_svg(points: Sequence[tuple[int, float | None, str]], *, lower_is_better: bool,
                 x_title: str, y_title: str, label: str) -> SafeString:
    """Attempts at beating the base, each a (number, candidate ÷ base or None, name) point:
    the tuner's trials and any run's experiments read alike, the base dashed at 1.0, the best
    so far (lowest or highest, as the goal has it) as a line, an unmeasured one as a cross."""
    if not points:
        return SafeString("")
    values = [v for _, v, _ in points if v is not None] + [1.0]
    last = max(n for n, _, _ in points)
    plot = _Plot(last, min(values), max(values), x_title, y_title, label)
    plot.parts.append(f'<line class="base" x1="{LEFT}" y1="{plot.y(1.0):.1f}" '
                      f'x2="{WIDTH - RIGHT}" y2="{plot.y(1.0):.1f}"/>')
    plot.parts.append(f'<text class="label" x="{WIDTH - RIGHT}" y="{plot.y(1.0) - 4:.1f}" '
                      'text-anchor="end">base 1.0</text>')
    for number in range(1, last + 1, max(1, round(last / 10))):
        plot.x_label(number, str(number))
    better = min if lower_is_better else max
    best: float | None = None
    line, marks = [], []
    for number, value, name in points:
        if value is None:
            cx, cy = plot.x(number), HEIGHT - BOTTOM
            marks.append(f'<path class="failed" d="M{cx - 4:.1f},{cy - 4} l8,8 m0,-8 l-8,8">'
                         f"<title>{escape(name)}: no measurement</title></path>")
            continue
        best = value if best is None else better(best, value)
        line.append(f"{plot.x(number):.1f},{plot.y(best):.1f}")
        marks.append(f'<circle class="trial" cx="{plot.x(number):.1f}" '
                     f'cy="{plot.y(value):.1f}" r="4"><title>{escape(name)}: {value:.4g}'
                     "</title></circle>")
    if line:
        plot.parts.append(f'<polyline class="best" points="{" ".join(line)}"/>')
    plot.parts += marks
    return plot.svg()


def evolution_svg(points: Sequence[Point], metric: str) -> SafeString:
    if not points:
        return SafeString("")
    bounds = [p.median for p in points] + [v for p in points for v in (p.low, p.high)
                                            if v is not None]
    unit = f" ({points[0].unit})" if points[0].unit else ""
    plot = _Plot(len(points), min(bounds), max(bounds), "version (merge order)",
                 f"{metric}{unit}, median", f"{metric} across the base and each merged change")
    line, marks = [], []
    for number, point in enumerate(points, 1):
        x, y = plot.x(number), plot.y(point.median)
        plot.x_label(number, point.label.split(" ")[0])
        line.append(f"{x:.1f},{y:.1f}")
        if point.low is not None and point.high is not None:
            marks.append(f'<line class="interval" x1="{x:.1f}" y1="{plot.y(point.low):.1f}" '
                         f'x2="{x:.1f}" y2="{plot.y(point.high):.1f}"/>')
        interval = (f", 95% interval {point.low:.4g}-{point.high:.4g}"
                    if point.low is not None and point.high is not None else "")
        marks.append(f'<circle class="trial" cx="{x:.1f}" cy="{y:.1f}" r="4"><title>'
                      f"{escape(point.label)}: {point.median:.4g} {escape(point.unit)}"
                      f"{interval}</title></circle>")
    plot.parts.append(f'<polyline class="best" points="{" ".join(line)}"/>')
    plot.parts += marks
    return plot.svg()
