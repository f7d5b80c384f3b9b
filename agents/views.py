"""Run pages: start, watch live, pause, resume, cancel."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.db import connections, router
from django.db.models import QuerySet
from django.db.models.fields.json import KT
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils.safestring import SafeString
from django.views.decorators.http import require_POST

from agents import services
from agents.charts import evolution_svg
from agents.goals import evolution, goal_progress
from agents.models import AgentRun, Hypothesis, RunMessage, Step
from agents.panels import start_controls
from agents.policies.llm import called_summary, untrusted_parts
from infraops.access import (
    AuthenticatedHttpRequest,
    get_visible_or_404,
    read_visible_or_404,
    request_target_roles,
    require_any_role,
    visible_target_ids,
)
from infraops.errors import QUEUE_DOWN, DomainError, queue_errors
from infraops.experiments.workers import missing_worker_message
from infraops.fragments import rendered_once
from infraops.live import cursor
from infraops.models import Experiment, Goal, Target
from infraops.ratelimit import START_RUN, throttled
from infraops.reads import JoinedRead, give_related
from infraops.services.goals import spec_changes
from reviews.live import awaiting_count, reviewer_classes
from reviews.models import Change, approved_over_failing_checks

# The dashboard's lists, as scoped(...) would give them: every target and run for a superuser,
# else those of the targets the user is a member of (visible_target_ids). A run's goal version
# is shown as "target: goal vN", so the goal's target comes too.
_TARGETS = {False: JoinedRead(Target, where="t0.id = ANY(%s)", order_by="t0.name"),
            True: JoinedRead(Target, where="TRUE", order_by="t0.name")}
_RECENT_RUNS = {
    every: JoinedRead(AgentRun, "goal_version__goal__target", "target", "started_by",
                      where="TRUE" if every else "t0.target_id = ANY(%s)",
                      order_by="t0.created_at DESC, t0.id DESC", limit=20)
    for every in (False, True)}


def dashboard(request: AuthenticatedHttpRequest) -> HttpResponse:
    require_any_role(request)
    ids = visible_target_ids(request.user)
    every, params = ids is None, ([] if ids is None else [ids])
    return render(request, "agents/dashboard.html", {
        "targets": _TARGETS[every].all(*params),
        # the nav's count (the user's classes), so the two never disagree (issue 27)
        "pending_reviews": awaiting_count(request, reviewer_classes(request.user)),
    } | dashboard_live(ids))


def dashboard_live(target_ids: list[int] | None) -> dict[str, Any]:
    """What the dashboard keeps live (agents.consumers.DashboardConsumer re-renders it): the
    goals with their progress and the recent runs, of these targets (None: every target)."""
    every, params = target_ids is None, ([] if target_ids is None else [target_ids])
    return {"goals": goal_progress(target_ids), "runs": _RECENT_RUNS[every].all(*params)}


def goal_detail(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    """A goal: its metric across the base and every merged change (the evolution chart), its
    versions with what each changed, its runs and merged changes."""
    goal = get_visible_or_404(Goal.objects.select_related("target", "boundary"), request, pk=pk)
    points = evolution(goal)
    versions = list(goal.versions.select_related("created_by").order_by("number"))
    history = [{"version": v, "changes": spec_changes(versions[i - 1].spec if i else None, v.spec)}
               for i, v in enumerate(versions)]
    target_roles = request_target_roles(request, goal.target_id)
    return render(request, "agents/goal.html", {
        "goal": goal, "points": points, "chart": evolution_svg(points, goal.metric),
        # the dashboard's row of this goal, so the two never disagree
        "progress": next(p for p in goal_progress([goal.target_id]) if p.goal.pk == goal.pk),
        # Start a run where the goal is read, as on the target page (engineers only).
        "controls": start_controls(goal, target_roles),
        "history": list(reversed(history)),
        "runs": AgentRun.objects.filter(goal_version__goal=goal)
                .select_related("goal_version__goal__target", "started_by")[:50],
        "merged": Change.objects.filter(goal=goal, status=Change.Status.MERGED)
                  .annotate(overridden=approved_over_failing_checks()).order_by("-merged_at"),
        "target_roles": target_roles,
    })


# A run with what its pages show of it: the goal's version, goal and target, and who started it.
RUN_READ = JoinedRead(AgentRun, "goal_version__goal__target", "target", "started_by")


# A run's ledger and messages, each with its author (Meta.ordering: by time within the run).
_HYPOTHESES = JoinedRead(Hypothesis, "author", where="t0.run_id = %s",
                         order_by="t0.created_at, t0.id")
_MESSAGES = JoinedRead(RunMessage, "author", where="t0.run_id = %s",
                       order_by="t0.created_at, t0.id")


def load_ledger(run: AgentRun) -> None:
    """The run's ledger and messages, each with its authors in one query, where the page's
    partials read them (run.hypotheses.all, run.messages.all)."""
    give_related(run, "hypotheses", _HYPOTHESES.all(run.pk))
    give_related(run, "messages", _MESSAGES.all(run.pk))


def _get_run_for_user(request: AuthenticatedHttpRequest, pk: int) -> AgentRun:
    return read_visible_or_404(RUN_READ, request, pk)


@require_POST
def run_start(request: AuthenticatedHttpRequest, goal_id: int) -> HttpResponse:
    goal = get_visible_or_404(Goal.objects.select_related("target"), request, pk=goal_id)
    if (refused := throttled(request, START_RUN)) is not None:
        return refused
    others = list(AgentRun.objects.filter(goal_version__goal=goal,
                                          status__in=AgentRun.active_statuses())
                  .order_by("-pk").values_list("pk", flat=True))
    try:
        run = services.run_start(goal=goal, user=request.user, fetch=False)
    except DomainError as exc:
        messages.error(request, str(exc))
        return redirect("infraops:target", name=goal.target.name)
    except queue_errors():
        # run_start checks the queue first; this is the rest: a page that says so, not a 500.
        messages.error(request, f"{QUEUE_DOWN}; the run may not have started: "
                                "check the runs list before trying again.")
        return redirect("infraops:target", name=goal.target.name)
    others = [pk for pk in others if pk != run.pk]
    if others:
        messages.warning(request, f"Run {others[0]} is also active on this goal: the two compete "
                                  "for the workers, and their changes may conflict.")
    return redirect("agents:run", pk=run.pk)


ARGUMENT_CUT = 2000  # characters of one argument value shown on the page
ARGUMENTS_CUT = 8000  # characters of a call's whole pretty-printed arguments
CONTENT_CUT = 4000  # characters of what the model read back


def _cut(text: str, limit: int) -> tuple[str, int]:
    """The first `limit` characters of text, and how many more there were."""
    return text[:limit], max(len(text) - limit, 0)


def _cut_values(value: Any, depth: int = 0) -> Any:
    """The arguments with each long string cut, saying how much was left out."""
    if depth > 20 and isinstance(value, dict | list):
        value = json.dumps(value, default=str)  # deeper than any tool's schema: as text
    if isinstance(value, str):
        shown, more = _cut(value, ARGUMENT_CUT)
        return f"{shown}… ({more} more characters)" if more else value
    if isinstance(value, dict):
        return {str(key): _cut_values(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_cut_values(item, depth + 1) for item in value]
    return value


CALL_BADGES = {"ok": "info", "refused": "bad", "malformed": "warn", "failed": "fail"}
LINE_VALUE_CUT = 80  # characters of one argument value in a call's one-line form
LINE_CUT = 240  # characters of a call's arguments in its one-line form


def _one_line(arguments: Any) -> str:
    """A call's arguments on one line, `key=value` each, long values cut: the transcript's
    line; the call's details hold them whole."""
    if not isinstance(arguments, dict):
        return ""
    pairs = []
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                                 default=str)
        text = " ".join(text.split())
        if len(text) > LINE_VALUE_CUT:
            text = text[:LINE_VALUE_CUT] + "…"
        pairs.append(f"{key}={text}")
    line = " ".join(pairs)
    return line if len(line) <= LINE_CUT else line[:LINE_CUT] + "…"


@dataclass(frozen=True)
class ContentPart:
    """A piece of what a tool gave back: `untrusted` for repository content and probe output
    (agents.policies.llm.untrusted), shown marked instead of with the tags the model reads."""

    text: str
    untrusted: bool


def _content_parts(content: str, limit: int) -> tuple[list[ContentPart], int]:
    """The content's parts within `limit` characters in all, and how many were left out.
    Split before the cut, so a cut never leaves half a marker on the page."""
    parts, budget, more = [], limit, 0
    for text, marked in untrusted_parts(content):
        shown = text[:budget]
        more += len(text) - len(shown)
        budget -= len(shown)
        if shown:
            parts.append(ContentPart(shown, marked))
    return parts, more


@dataclass(frozen=True)
class CallView:
    """One tool call of a step, as the page shows it (texts cut, never trusted)."""

    id: str
    name: str
    state: str  # ok, refused, malformed or failed
    reason: str
    line: str  # the arguments on one line (_one_line)
    arguments: str
    arguments_more: int
    raw: str
    parts: list[ContentPart]
    content_more: int

    @property
    def badge(self) -> str:
        """The class of the call's badge in its step's row: red, amber or neutral, as its
        details mark it."""
        return CALL_BADGES[self.state]

    @classmethod
    def of(cls, call: dict[str, Any]) -> CallView:
        arguments = call.get("arguments")
        malformed = bool(call.get("malformed"))
        refusal = str(call.get("refusal") or "")
        content = call.get("content")
        if not isinstance(content, str):
            content = "" if content is None else json.dumps(content, indent=2, default=str)
        raw = ""
        if malformed and isinstance(arguments, dict) and set(arguments) == {"raw"}:
            raw, arguments = str(arguments["raw"])[:ARGUMENT_CUT], None
        pretty = ("" if arguments in (None, {}) else
                  json.dumps(_cut_values(arguments), indent=2, ensure_ascii=False, default=str))
        data = call.get("data")
        error = str(data.get("error") or "") if isinstance(data, dict) else ""
        if refusal:
            state, reason = "refused", refusal
        elif malformed:
            state, reason = "malformed", error or content.strip().split("\n", 1)[0]
        elif call.get("ok"):
            state, reason = "ok", ""
        else:
            state, reason = "failed", error
        shown_arguments, arguments_more = _cut(pretty, ARGUMENTS_CUT)
        parts, content_more = _content_parts(content, CONTENT_CUT)
        return cls(id=str(call.get("id") or ""), name=str(call.get("name") or "?"), state=state,
                   reason=reason[:500], line=_one_line(arguments) if not raw else raw[:LINE_CUT],
                   arguments=shown_arguments, arguments_more=arguments_more, raw=raw,
                   parts=parts, content_more=content_more)


@dataclass(frozen=True)
class StepView:
    """A step as a transcript: the model's own words (its answer's text, its reasoning where
    the server sent it), then one line per tool call."""

    step: Step
    calls: list[CallView]
    words: str = ""
    reasoning: str = ""

    @property
    def summary(self) -> str:
        """The step's summary, unless it only names the calls its lines show."""
        names = ", ".join(call.name for call in self.calls)
        redundant = bool(self.calls) and self.step.summary == called_summary(names)
        return "" if redundant else self.step.summary


# What the page shows of a step: not its arguments and result (the calls carry them), nor an
# experiment's feedback, summary and logs (only its status); of the policy's record, only the
# model's words (the database reads them out of it: the record holds the news sent too).
STEP_FIELDS = ("run", "number", "summary", "calls", "verdict", "experiment__status")


def _step_views(steps: QuerySet[Step]) -> list[StepView]:
    steps = steps.select_related("experiment").only(*STEP_FIELDS).annotate(
        words=KT("arguments__assistant__content"), reasoning=KT("arguments__reasoning"))
    return [StepView(step, [CallView.of(call) for call in
                            (step.calls if isinstance(step.calls, list) else [])
                            if isinstance(call, dict)],
                     words=(getattr(step, "words", None) or "").strip(),
                     reasoning=(getattr(step, "reasoning", None) or "").strip())
            for step in steps]


def _event_rows(run: AgentRun, after: int) -> SafeString:
    """The log's rows after `after`, each the `run-event` partial rendered once per process.

    Events are append-only (agents/events.py) and a row shows nothing but its event, so a
    rendered row never goes stale; the key names the run's creation too, so a database that was
    reset (and gave a pk again) meets none of the old rows. The rows run up to the run's
    event_seq as read with the run: an event's number and its row commit together, so every
    one up to it is there, and the page's socket asks for the later ones when it connects."""
    prefix = f"run-event:{run.pk}:{run.created_at.timestamp()}:"

    def fetch(seqs: set[int]) -> Iterable[tuple[int, dict[str, Any]]]:
        events = run.events.filter(seq__gte=min(seqs), seq__lte=max(seqs))
        return ((event.seq, {"event": event}) for event in events if event.seq in seqs)

    keys = {f"{prefix}{seq}": seq for seq in range(after + 1, run.event_seq + 1)}
    return rendered_once("agents/run.html#run-event", keys, fetch)


# What a step's row key names, by number: a literal statement (bandit, B608) rather than the
# ORM's values_list, which cost more CPU than the query itself (bench/load.py).
_STEP_KEYS = """SELECT s.id, s.experiment_id, e.status FROM agents_step s
LEFT JOIN infraops_experiment e ON e.id = s.experiment_id WHERE s.run_id = %s ORDER BY s.number"""


def _step_rows(run: AgentRun) -> SafeString:
    """The steps' rows, each the `run-step` partial rendered once per process: a step is
    written once (agents.services._record) and its row shows only the step and its
    experiment's status, which the key names (and the run's creation, as for the log)."""
    with connections[router.db_for_read(Step)].cursor() as db:
        db.execute(_STEP_KEYS, [run.pk])
        shown = db.fetchall()
    created = run.created_at.timestamp()

    def fetch(pks: set[int]) -> Iterable[tuple[int, dict[str, Any]]]:
        return ((view.step.pk, {"view": view})
                for view in _step_views(run.steps.filter(pk__in=pks)))

    keys = {f"run-step:{pk}:{created}:{experiment}:{status}": pk
            for pk, experiment, status in shown}
    return rendered_once("agents/run.html#run-step", keys, fetch)


def run_detail(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    """The run page; for htmx, the live partial (events after `after`); with `steps_after`,
    only the rows of the steps after that number (the page's script appends them)."""
    run = _get_run_for_user(request, pk)
    if "steps_after" in request.GET:
        after_step = cursor(request.GET["steps_after"])
        rows = _step_views(run.steps.order_by("number").filter(number__gt=after_step))
        return render(request, "agents/run.html#run-step-rows", {"run": run, "step_views": rows})
    load_ledger(run)
    after = cursor(request.GET.get("after"))
    context: dict[str, Any] = {
        "run": run, "worker_warning": _worker_warning(run),
        "steer_form": SteerForm(), "target_roles": request_target_roles(request, run.target_id),
    }
    if request.htmx:
        context["events"] = run.events.filter(seq__gt=after).order_by("seq")
        return render(request, "agents/run.html#live-update", context)
    return render(request, "agents/run.html", context | {"event_rows": _event_rows(run, after),
                                                         "step_rows": _step_rows(run)})


class SteerForm(forms.Form):
    kind = forms.ChoiceField(choices=[("message", "message"), ("hypothesis", "hypothesis")])
    text = forms.CharField(max_length=4000, widget=forms.Textarea(attrs={"rows": 2}))
    title = forms.CharField(max_length=200, required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("kind") == "hypothesis" and not data.get("title"):
            self.add_error("title", "A hypothesis needs a title.")
        return data


@require_POST
def run_steer(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    run = _get_run_for_user(request, pk)
    form = SteerForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(str(e) for errors in form.errors.values() for e in errors))
        return redirect("agents:run", pk=run.pk)
    try:
        if form.cleaned_data["kind"] == "hypothesis":
            services.hypothesis_add(run=run, user=request.user, title=form.cleaned_data["title"],
                                    rationale=form.cleaned_data["text"])
        else:
            services.run_message_add(run=run, user=request.user, text=form.cleaned_data["text"])
    except DomainError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Sent: the agent receives it at its next step.")
    return redirect("agents:run", pk=run.pk)


def _worker_warning(run: AgentRun) -> str | None:
    """Why nothing moves, when no worker consumes the queue the run now waits on."""
    if run.status != AgentRun.Status.RUNNING:
        return None
    queue = "agent"
    if run.waiting_for_id is not None:
        queue = (Experiment.objects.filter(pk=run.waiting_for_id, status=Experiment.Status.QUEUED)
                 .values_list("queue", flat=True).first() or "agent")
    return missing_worker_message(queue)


@require_POST
def run_control(request: AuthenticatedHttpRequest, pk: int, action: str) -> HttpResponse:
    run = _get_run_for_user(request, pk)
    control = {"pause": services.run_pause, "resume": services.run_resume,
               "cancel": services.run_cancel}.get(action)
    if control is None:
        return HttpResponse(f"Unknown action {action!r}.", status=400)
    try:
        run = control(run=run, user=request.user)
    except DomainError as exc:
        if request.htmx:
            return HttpResponse(str(exc), status=409)
        messages.error(request, str(exc))
    if request.htmx:
        return render(request, "agents/run.html#run-controls",
                      {"run": run, "target_roles": request_target_roles(request, run.target_id)})
    return redirect("agents:run", pk=run.pk)
