"""infraops/feedback/charts.py: plain data in, a JSON-ready plotly figure out."""

from __future__ import annotations

import json

import pytest

from infraops.feedback.charts import (
    ab_distributions,
    error_vs_size,
    feedback_charts,
    timeline_caption,
    trace_timeline,
)


def test_ab_distributions_has_one_box_per_side_with_every_execution() -> None:
    figure = ab_distributions([{"label": "p latency", "baseline": [1.0, 2.0, 3.0],
                                "candidate": [0.5, 0.6]}])
    boxes = {trace["name"]: trace for trace in figure["data"]}

    assert set(boxes) == {"baseline", "candidate"}
    assert boxes["baseline"]["y"] == [1.0, 2.0, 3.0]
    assert boxes["candidate"]["x"] == ["p latency", "p latency"]
    json.dumps(figure)  # plain JSON, ready for json_script


def test_error_vs_size_is_log_log_and_skips_empty_series() -> None:
    figure = error_vs_size([
        {"label": "[cp=on] vs [cp=off]", "metric": "max_abs_error",
         "points": [[128, 0.007], [8192, 0.076]]},
        {"label": "empty", "metric": "max_abs_error", "points": []},
    ])

    assert [t["name"] for t in figure["data"]] == ["[cp=on] vs [cp=off] (max_abs_error)"]
    assert figure["data"][0]["x"] == [128, 8192]
    assert figure["layout"]["xaxis"]["type"] == figure["layout"]["yaxis"]["type"] == "log"


def test_every_axis_says_what_it_measures_and_in_which_unit() -> None:
    one_unit = ab_distributions([{"label": "p latency_ms", "unit": "ms", "baseline": [1.0],
                                  "candidate": [0.9]},
                                 {"label": "p p99_ms", "unit": "ms", "baseline": [2.0],
                                  "candidate": [1.8]}])
    assert one_unit["layout"]["yaxis"]["title"]["text"] == "value (ms)"
    assert one_unit["layout"]["xaxis"]["title"]["text"] == "metric"
    mixed = ab_distributions([{"label": "a", "unit": "ms", "baseline": [1.0], "candidate": [1.0]},
                              {"label": "b", "unit": "tokens/s", "baseline": [5.0],
                               "candidate": [6.0]}])
    # Each unit has a panel of its own, its axis named by it.
    assert mixed["layout"]["yaxis"]["title"]["text"] == "value (ms)"
    assert mixed["layout"]["yaxis2"]["title"]["text"] == "value (tokens/s)"
    curve = error_vs_size([{"label": "x", "metric": "max_abs_error", "points": [[8, 0.1]]}])
    assert curve["layout"]["xaxis"]["title"]["text"] == "case size (elements)"
    assert curve["layout"]["yaxis"]["title"]["text"].startswith("error against the reference")


TIMELINE = {"unit": "ms", "duration": 0.55, "threads": ["main", "mooncake"],
            "spans": [[0, "dispatch", 0.0, 0.1], [1, "kv_transfer", 0.1, 0.15]],
            "waits": [[1, "gil_wait", 0.02, 0.1]], "idle": [[0, 0.1, 0.15], [1, 0.0, 0.02]],
            "overlap": [[0.3, 0.35]], "left_out": 0}


def test_the_trace_timeline_has_a_row_per_thread_and_highlights_waits_idle_and_overlap() -> None:
    figure = trace_timeline("prefill-kv [default, candidate]", TIMELINE)
    bars = {trace["name"]: trace for trace in figure["data"] if trace["type"] == "bar"}

    assert set(bars) == {"span", "waiting (blocked)", "idle"}
    assert bars["span"]["y"] == ["main", "mooncake"] and bars["span"]["base"] == [0.0, 0.1]
    assert bars["waiting (blocked)"]["hovertext"] == ["gil_wait"]
    assert bars["idle"]["y"] == ["main", "mooncake"]
    band = figure["layout"]["shapes"][0]
    assert (band["x0"], band["x1"], band["yref"]) == (0.3, 0.35, "paper")
    assert figure["layout"]["xaxis"]["title"]["text"] == "time since the trace's first span (ms)"
    json.dumps(figure)


def test_the_timeline_caption_says_in_words_what_the_chart_shows() -> None:
    text = timeline_caption(TIMELINE)

    assert "same time for 9.1% of the trace (0.05 of 0.55 ms)" in text
    assert "Idle: main 9%, mooncake 4%." in text
    assert timeline_caption({"duration": 0}) == "The trace has no timed spans."


def test_feedback_charts_draw_one_timeline_per_stored_trace_with_its_caption() -> None:
    one_thread = TIMELINE | {"threads": ["main"], "spans": [], "waits": [], "idle": []}
    charts = feedback_charts({"timelines": {"a [x]": one_thread, "b [y]": TIMELINE}})

    assert [c["id"] for c in charts] == ["chart-timeline-0", "chart-timeline-1"]
    assert charts[1]["figure_id"] == "chart-timeline-1-figure" and charts[1]["caption"]
    # The one with more threads first: the timelines are read for concurrency.
    assert charts[0]["figure"]["layout"]["title"]["text"] == "Timeline: b [y]"


def test_microseconds_and_instruction_counts_never_share_an_axis() -> None:
    figure = ab_distributions([
        {"label": "p decode_us", "metric": "decode_us", "unit": "us", "baseline": [90.0],
         "candidate": [76.0]},
        {"label": "p instructions", "metric": "instructions", "unit": "instructions",
         "baseline": [3e9], "candidate": [2.9e9]},
        {"label": "p registers", "metric": "registers", "baseline": [107.0],
         "candidate": [168.0]}])

    axes = {trace["yaxis"] for trace in figure["data"]}
    assert axes == {"y", "y2", "y3"}
    by_axis = {trace["yaxis"]: trace["x"][0] for trace in figure["data"]}
    assert by_axis == {"y": "p decode_us", "y2": "p instructions", "y3": "p registers"}
    assert [t["showlegend"] for t in figure["data"]] == [True, True, False, False, False, False]


def test_an_exact_match_on_the_error_curve_is_marked_not_sunk_to_1e_30() -> None:
    figure = error_vs_size([{"label": "ieee", "metric": "max_rel_error",
                             "points": [[64, 0.0], [1024, 3.9e-06], [4096, 8e-06]]}])

    [line] = figure["data"]
    assert line["y"] == [pytest.approx(3.9e-07), 3.9e-06, 8e-06]
    assert line["hovertext"] == ["0 (exact match)", "3.9e-06", "8e-06"]
    assert line["marker"]["symbol"] == ["circle-open", "circle", "circle"]
