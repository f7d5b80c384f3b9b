"""Parts of pages rendered once per process: rows that never change once written, and a
finished experiment's feedback charts.

What the reading pages show most of is written once and never edited: a run's log and steps
(agents/views.py), an experiment's probe output, and the feedback an experiment finishes with.
Rendering those again on every request was most of the pages' web CPU on the load bench
(bench/load.py), so each is rendered once per web process and kept in a bounded in-process
cache under a key that names everything it shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.core.cache import caches
from django.template.loader import get_template, render_to_string
from django.utils.safestring import SafeString, mark_safe

from infraops.feedback.charts import feedback_charts
from infraops.models import Experiment

CHARTS_TEMPLATE = "infraops/charts.html"


def rendered_once(partial: str, keys: dict[str, int],
                  fetch: Callable[[set[int]], Iterable[tuple[int, dict[str, Any]]]],
                  ) -> SafeString:
    """The rows named by `keys` (cache key -> row id), in their order, each `partial` rendered
    once per process (the `fragments` cache); `fetch(ids)` gives the context of each row not
    rendered yet. Only for rows whose key names everything they show."""
    fragments = caches["fragments"]
    rows = fragments.get_many(list(keys))
    missing = {row for key, row in keys.items() if key not in rows}
    if missing:
        template = get_template(partial)
        key_of = {row: key for key, row in keys.items()}
        fresh = {key_of[row]: template.render(context) for row, context in fetch(missing)}
        fragments.set_many(fresh)
        rows |= fresh
    # Each row is the partial's own output, escaped where it shows data.
    return mark_safe("".join(rows.get(key, "") for key in keys))  # noqa: S308  # nosec


def finished_part(part: str, experiment: Experiment, render: Callable[[], str],
                  *depends_on: object) -> SafeString | None:
    """`render()`, a part of a page that shows a finished experiment's record, rendered once
    per process (the `experiments` cache); None while the experiment is not finished (its
    record still grows: the caller renders it on each read).

    An experiment's feedback and summary are written once, by the statement that finishes it
    (infraops.experiments.services._finish), after its executions: a finished experiment's
    record changes only when another attempt finishes it again. The key names the part, the
    experiment, its creation (a database that was reset and gave a pk again meets none of the
    old entries), its attempt and its finish, and whatever else the part shows (`depends_on`)."""
    if not experiment.is_finished or experiment.finished_at is None:
        return None
    key = ":".join(str(item) for item in (
        part, experiment.pk, experiment.created_at.timestamp(), experiment.attempts,
        experiment.finished_at.timestamp(), *depends_on))
    cache = caches["experiments"]
    html: str | None = cache.get(key)
    if html is None:
        html = str(render())
        cache.set(key, html, timeout=None)
    # The part is a template's own output, escaped where it shows data.
    return mark_safe(html)  # noqa: S308  # nosec


def charts_html(experiment: Experiment | None) -> SafeString:
    """The experiment's feedback charts as its page and its change's page embed them
    (infraops/charts.html); "" when its feedback draws none. Building a plotly figure costs
    tens of milliseconds (plotly validates and copies every property it is given): three
    charts were three quarters of those pages' CPU, so a finished experiment's are drawn once
    per process."""
    if experiment is None:
        return SafeString("")
    return finished_part("charts", experiment, lambda: _charts(experiment)) or _charts(experiment)


def _charts(experiment: Experiment) -> SafeString:
    charts = feedback_charts(experiment.feedback or {})
    html = render_to_string(CHARTS_TEMPLATE, {"charts": charts}) if charts else ""
    return mark_safe(html)  # noqa: S308  # nosec: the template escapes what it shows
