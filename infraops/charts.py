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

LAYOUT = {"margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "height": 320,
          "template": "simple_white", "font": {"size": 12}}


def error_vs_size(series: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One line per comparison: the error at each case size, log-log (the curve that shows
    an accumulating precision loss)."""
    figure = go.Figure()
    for item in series:
        points = item.get("points") or []
        if not points:
            continue
        figure.add_trace(go.Scatter(
            x=[p[0] for p in points], y=[max(p[1], 1e-30) for p in points],
            mode="lines+markers", name=f"{item.get('label', '')} ({item.get('metric', '')})"))
    figure.update_layout(title="Error versus size",
                         xaxis={"type": "log", "title": "case size (elements)"},
                         yaxis={"type": "log", "title": "error against the reference (absolute "
                                "or relative, as each line's label says)"}, **LAYOUT)
    return _plain(figure)


def ab_distributions(groups: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Baseline and candidate values side by side per compared metric (one point per
    execution), so a reviewer sees the spread behind each verdict."""
    figure = go.Figure()
    for side, colour in (("baseline", "#66707c"), ("candidate", "#2457c5")):
        labels: list[str] = []
        values: list[float] = []
        for group in groups:
            for value in group.get(side, []):
                labels.append(str(group.get("label", "")))
                values.append(float(value))
        figure.add_trace(go.Box(x=labels, y=values, name=side, boxpoints="all",
                                marker_color=colour))
    units = sorted({str(g.get("unit") or "") for g in groups} - {""})
    # One axis for every compared metric: its unit when they share one, else each label's.
    y_title = f"value ({units[0]})" if len(units) == 1 else "value, in each metric's own unit"
    figure.update_layout(title="Baseline and candidate, one point per execution",
                         boxmode="group", xaxis={"title": "metric"}, yaxis={"title": y_title},
                         **LAYOUT)
    return _plain(figure)


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
    return charts


def _plain(figure: go.Figure) -> dict[str, Any]:
    """Plain JSON data (plotly's own encoder turns its arrays into lists)."""
    plain: dict[str, Any] = json.loads(pio.to_json(figure, validate=False, engine="json"))
    return {"data": plain["data"], "layout": plain["layout"]}
