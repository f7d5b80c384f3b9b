"""The run page's experiments with their chart of trials. (What the agents app shows on the
core's pages is drawn through the core's panels: agents/panels.py.)"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django import template
from django.db import connections, router
from django.utils.safestring import SafeString

from agents.charts import progress_svg, trials_svg
from agents.models import AgentRun
from infraops.models import Experiment

register = template.Library()


@dataclass(frozen=True)
class RunExperiment:
    """One experiment of a run as its page shows it."""

    id: int
    status: str
    lost: bool  # failed for the infrastructure's reasons (Experiment.lost)
    started_at: datetime | None
    finished_at: datetime | None
    step: int | None  # the first step that names it: the one that asked for it
    tested: str  # the titles of the hypotheses it tests, else that step's summary
    ratio: float | None  # the goal metric, candidate ÷ base; None where it was not measured

    @property
    def unmeasured(self) -> bool:
        """Ended without a goal metric: a cross on the chart (one still going is no point)."""
        return self.ratio is None and self.status in _ENDED


_ENDED = {Experiment.Status.SUCCEEDED, Experiment.Status.FAILED, Experiment.Status.CANCELLED}


# The run's experiments in the order they were asked for: those it asked for and those its
# steps name. Each with the first step naming it, the titles of its hypotheses on this run,
# and the medians over the goal metric's cells of its summary, candidate and base, as the
# tuner reads its objective (agents.policies.tuner._goal_medians): the database reads the
# summaries, which a sweep's cells make long, and sends two numbers. One statement for the
# table and the chart, whatever the count; a literal one (bandit, B608), as
# agents.views._STEP_KEYS.
_EXPERIMENTS = """SELECT e.id, e.status, e.lost, e.started_at, e.finished_at, s.number,
 left(s.summary, 300),
 (SELECT string_agg(h.title, '; ' ORDER BY h.id) FROM agents_hypothesis_experiments he
  JOIN agents_hypothesis h ON h.id = he.hypothesis_id
  WHERE he.experiment_id = e.id AND h.run_id = %(run)s),
 g.candidate, g.base
FROM infraops_experiment e
LEFT JOIN LATERAL (SELECT number, summary FROM agents_step WHERE run_id = %(run)s
                   AND experiment_id = e.id ORDER BY number LIMIT 1) s ON TRUE
CROSS JOIN LATERAL (
 SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY CASE WHEN
          jsonb_typeof(c->'candidate_median') = 'number' THEN (c->>'candidate_median')::float8 END
        ) AS candidate,
        percentile_cont(0.5) WITHIN GROUP (ORDER BY CASE WHEN
          jsonb_typeof(c->'baseline_median') = 'number' THEN (c->>'baseline_median')::float8 END
        ) AS base
 FROM jsonb_path_query(e.summary, '$.comparisons[*] ? (@.probe == $p && @.metric == $m)',
                       jsonb_build_object('p', %(probe)s::text, 'm', %(metric)s::text)) c) g
WHERE e.id IN (SELECT experiment_id FROM agents_agentrun_experiments WHERE agentrun_id = %(run)s
               UNION SELECT experiment_id FROM agents_step
               WHERE run_id = %(run)s AND experiment_id IS NOT NULL)
ORDER BY e.id"""


@register.filter
def run_experiments(run: AgentRun) -> list[RunExperiment]:
    """A filter, so that the page and the socket's frames, which render the run's live parts
    with the run alone (agents.consumers), read them alike: once a render, for both the
    table and the chart."""
    spec = run.goal_version.spec
    with connections[router.db_for_read(Experiment)].cursor() as db:
        db.execute(_EXPERIMENTS, {"run": run.pk, "probe": str(spec.get("probe", "")),
                                  "metric": str(spec.get("metric", ""))})
        rows = db.fetchall()
    return [RunExperiment(id=pk, status=status, lost=lost, started_at=started,
                          finished_at=finished, step=step, tested=hypotheses or summary or "",
                          ratio=candidate / base if candidate is not None and base else None)
            for pk, status, lost, started, finished, step, summary, hypotheses, candidate, base
            in rows]


@register.filter
def experiment_tally(experiments: list[RunExperiment]) -> str:
    """The run's experiments counted by what they are worth as evidence: measured apart from
    lost to infrastructure (issue 28: a run that lost five of six looked like any other)."""
    counts = {"measured": 0, "lost to infrastructure": 0, "failed": 0, "cancelled": 0,
              "not finished": 0}
    for experiment in experiments:
        if experiment.lost:
            counts["lost to infrastructure"] += 1
        elif experiment.status == Experiment.Status.SUCCEEDED:
            counts["measured"] += 1
        elif experiment.status in _ENDED:
            counts[str(experiment.status)] += 1
        else:
            counts["not finished"] += 1
    parts = [f"{n} {what}" for what, n in counts.items() if n]
    total = len(experiments)
    return f"{total} experiment{'s' * (total != 1)}: {', '.join(parts)}." if parts else ""


@register.filter
def better(spec: dict[str, Any]) -> str:
    """Which way of a goal metric over the base's is better, in words."""
    return "higher" if spec.get("direction") == "maximize" else "lower"


@register.filter
def trials_chart(run: AgentRun, experiments: list[RunExperiment]) -> SafeString:
    """The run's attempts at beating the base as an SVG chart (agents.charts): the tuner's
    trials as its state records them (a configuration the boundary refused, which has no
    experiment, is one too), else the run's experiments, whatever its policy."""
    trials = run.state.get("trials") if isinstance(run.state, dict) else None
    if isinstance(trials, list) and trials:
        return trials_svg(trials)
    spec = run.goal_version.spec
    points = [(number, e.ratio, f"experiment {e.id}")
              for number, e in enumerate(experiments, 1) if e.ratio is not None or e.unmeasured]
    return progress_svg(points, lower_is_better=better(spec) == "lower",
                        x_title="experiment number (in the order asked for)",
                        y_title=f"{spec.get('metric', 'goal metric')}, \N{MULTIPLICATION SIGN} "
                                f"base ({better(spec)} is better)",
                        label="goal metric of each experiment and the best so far")
