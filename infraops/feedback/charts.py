"""Charts as pure functions: plain data in, a plotly figure (as a JSON-ready dict) out.

Rendered with plotly.js served from our own static files (no CDN); the page embeds each
figure as JSON and static/js/charts.js draws it, so no inline script is needed under the CSP.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

LAYOUT = {"margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "height": 320,
          "template": "simple_white", "font": {"size": 12}}


def error_vs_size(series: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One line per comparison: the error at each case size, log-log (the curve that shows
    an accumulating precision loss)."""
    figure = go.Figure()
    positive = [p[1] for item in series for p in item.get("points") or [] if p[1] > 0]
    # A log axis has no 0: an exact match is drawn a decade under the smallest error, as an
    # open marker whose hover says 0, instead of at 1e-30 where it flattens every curve.
    floor = min(positive) / 10 if positive else 1e-12
    for item in series:
        points = item.get("points") or []
        if not points:
            continue
        figure.add_trace(go.Scatter(
            x=[p[0] for p in points], y=[p[1] if p[1] > 0 else floor for p in points],
            mode="lines+markers", name=f"{item.get('label', '')} ({item.get('metric', '')})",
            marker={"symbol": ["circle" if p[1] > 0 else "circle-open" for p in points],
                    "size": [7 if p[1] > 0 else 11 for p in points]},
            hovertext=[f"{p[1]:.4g}" if p[1] > 0 else "0 (exact match)" for p in points],
            hovertemplate="size %{x}: %{hovertext}<extra></extra>"))
    figure.update_layout(title="Error versus size",
                         xaxis={"type": "log", "title": "case size (elements)"},
                         yaxis={"type": "log", "title": "error against the reference (absolute "
                                "or relative, as each line's label says)"}, **LAYOUT)
    return _plain(figure)


MAX_PANELS = 6


def ab_distributions(groups: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Baseline and candidate values side by side per compared metric (one point per
    execution), so a reviewer sees the spread behind each verdict: one panel per unit (a
    metric without a unit has a panel of its own), so microseconds and instruction counts
    never share an axis and flatten each other."""
    panels = _panels(groups)
    figure = make_subplots(rows=len(panels), cols=1, vertical_spacing=0.3 / len(panels))
    for row, (unit, members) in enumerate(panels, start=1):
        for side, colour in (("baseline", "#66707c"), ("candidate", "#2457c5")):
            labels = [str(g.get("label", "")) for g in members for _ in g.get(side, [])]
            values = [float(v) for g in members for v in g.get(side, [])]
            figure.add_trace(go.Box(x=labels, y=values, name=side, boxpoints="all",
                                    marker_color=colour, legendgroup=side,
                                    showlegend=row == 1), row=row, col=1)
        figure.update_yaxes(title_text=f"value ({unit})" if unit else "value", row=row, col=1)
    figure.update_xaxes(title_text="metric", row=len(panels), col=1)
    figure.update_layout(title="Baseline and candidate, one point per execution",
                         boxmode="group", **(LAYOUT | {"height": 60 + 260 * len(panels)}))
    return _plain(figure)


def _panels(groups: Sequence[Mapping[str, Any]]
            ) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """The groups by unit, in order of first appearance; those without a unit by metric (or
    label); at most MAX_PANELS, the rest in the last."""
    panels: dict[str, tuple[str, list[Mapping[str, Any]]]] = {}
    for group in groups:
        unit = str(group.get("unit") or "")
        key = unit or f"metric:{group.get('metric') or group.get('label', '')}"
        if key not in panels and len(panels) == MAX_PANELS:
            key = list(panels)[-1]
        panels.setdefault(key, (unit, []))[1].append(group)
    return list(panels.values()) or [("", [])]


TIMELINE_COLOURS = {"spans": "#2457c5", "waits": "#c0392b", "idle": "#c8ccd2",
                    "overlap": "rgba(46, 160, 67, 0.18)"}


def trace_timeline(label: str, timeline: Mapping[str, Any]) -> dict[str, Any]:
    """One row per thread: its spans as bars, waits (blocked time) in red, idle gaps in grey,
    and green bands where two threads or more worked at once (traces.timeline's data), so a
    reviewer sees at a glance whether the work that should overlap does."""
    threads = list(timeline.get("threads") or [])
    figure = go.Figure()
    for kind, name in (("idle", "idle"), ("spans", "span"), ("waits", "waiting (blocked)")):
        rows = timeline.get(kind) or []
        if kind == "idle":
            rows = [[row, "idle", start, end] for row, start, end in rows]
        figure.add_trace(go.Bar(
            orientation="h", name=name, marker_color=TIMELINE_COLOURS[kind],
            y=[threads[r[0]] for r in rows], base=[r[2] for r in rows],
            x=[r[3] - r[2] for r in rows], hovertext=[str(r[1]) for r in rows],
            hovertemplate="%{hovertext}: %{base:.3f} to %{customdata:.3f} ms<extra></extra>",
            customdata=[r[3] for r in rows]))
    figure.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="threads at work "
                                "together", marker={"symbol": "square", "size": 12,
                                                    "color": TIMELINE_COLOURS["overlap"]}))
    figure.update_layout(
        title=f"Timeline: {label}", barmode="overlay",
        shapes=[{"type": "rect", "xref": "x", "yref": "paper", "x0": start, "x1": end,
                 "y0": 0, "y1": 1, "fillcolor": TIMELINE_COLOURS["overlap"], "line": {"width": 0},
                 "layer": "below"} for start, end in (timeline.get("overlap") or [])[:300]],
        xaxis={"title": "time since the trace's first span (ms)"},
        yaxis={"title": "thread", "autorange": "reversed", "type": "category"},
        **(LAYOUT | {"height": 140 + 40 * max(len(threads), 1)}))
    return _plain(figure)


def timeline_caption(timeline: Mapping[str, Any]) -> str:
    """The timeline in one sentence, for readers without the chart: how long threads worked
    together, and each thread's idle share."""
    duration = float(timeline.get("duration") or 0)
    if duration <= 0:
        return "The trace has no timed spans."
    together = sum(end - start for start, end in timeline.get("overlap") or [])
    idle: dict[int, float] = {}
    for row, start, end in timeline.get("idle") or []:
        idle[row] = idle.get(row, 0.0) + end - start
    threads = timeline.get("threads") or []
    idle_text = ", ".join(f"{threads[row]} {share / duration:.0%}"
                          for row, share in sorted(idle.items()))
    text = (f"Threads worked at the same time for {together / duration:.1%} of the trace "
            f"({together:.3g} of {duration:.3g} ms).")
    text += f" Idle: {idle_text}." if idle_text else " No thread sat idle."
    if timeline.get("left_out"):
        text += f" The chart leaves out the {timeline['left_out']} shortest spans."
    return text


def feedback_charts(feedback: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The charts an experiment's feedback can draw, each with the element ids a page embeds
    it under (the experiment page and the change page show the same ones)."""
    charts = []
    if feedback.get("distributions"):
        charts.append({"id": "chart-ab", "figure_id": "chart-ab-figure",
                       "figure": ab_distributions(feedback["distributions"])})
    if feedback.get("series"):
        charts.append({"id": "chart-series", "figure_id": "chart-series-figure",
                       "figure": error_vs_size(feedback["series"])})
    # The timelines with the most threads first: those are the ones about concurrency.
    timelines = sorted((feedback.get("timelines") or {}).items(),
                       key=lambda item: -len(item[1].get("threads") or []))
    for number, (label, timeline) in enumerate(timelines):
        charts.append({"id": f"chart-timeline-{number}",
                       "figure_id": f"chart-timeline-{number}-figure",
                       "figure": trace_timeline(label, timeline),
                       "caption": timeline_caption(timeline)})
    return charts


def _plain(figure: go.Figure) -> dict[str, Any]:
    """Plain JSON data (plotly's own encoder turns its arrays into lists)."""
    plain: dict[str, Any] = json.loads(pio.to_json(figure, validate=False, engine="json"))
    return {"data": plain["data"], "layout": plain["layout"]}
