"""infraops/charts.py: plain data in, a JSON-ready plotly figure out."""

from __future__ import annotations

import json

from infraops.charts import ab_distributions, error_vs_size


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
    assert mixed["layout"]["yaxis"]["title"]["text"] == "value, in each metric's own unit"
    curve = error_vs_size([{"label": "x", "metric": "max_abs_error", "points": [[8, 0.1]]}])
    assert curve["layout"]["xaxis"]["title"]["text"] == "case size (elements)"
    assert curve["layout"]["yaxis"]["title"]["text"].startswith("error against the reference")
