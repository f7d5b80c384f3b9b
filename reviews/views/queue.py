"""The review queue: what waits for a decision, filtered, searched and paginated.

Pages are keyset pages on (created_at, id) descending: the cursor `after=<iso>_<id>` names
the last row shown, so a page costs the same at row 25 and at row 100,000, and a change
that arrives meanwhile shifts nothing. A parameter the page cannot read is dropped with a
message; the rest of the filters still apply.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.db import connections, router
from django.http import HttpResponse, QueryDict
from django.shortcuts import render
from django.utils import timezone

from infraops.access import AuthenticatedHttpRequest, is_superuser, require_any_role
from infraops.models import Goal
from infraops.reads import JoinedRead
from infraops.roles import AnyUser
from reviews.live import reviewer_classes
from reviews.models import RISK_CLASSES, Change

PAGE_SIZE = 25
ANY_STATUS = "any"
NO_CLASS = "none"
AGES: dict[str, tuple[str, timedelta]] = {
    "newer-1d": ("newer than 1 day", timedelta(days=1)),
    "older-1d": ("older than 1 day", timedelta(days=1)),
    "older-7d": ("older than 7 days", timedelta(days=7)),
    "older-30d": ("older than 30 days", timedelta(days=30)),
}
Cursor = tuple[datetime, int]
DEFAULTS = {"scope": "mine", "status": str(Change.Status.PENDING_REVIEW)}


# The filter's choices: the targets and goals the user sees (every one for a superuser), as
# literal statements (bandit, B608). Built by the ORM on every read of the queue, these two
# queries had cost a sixth of the page's web CPU (bench/load.py).
_TARGET_CHOICES = {
    True: "SELECT t.id, t.name FROM infraops_target t ORDER BY t.name",
    False: "SELECT t.id, t.name FROM infraops_target t WHERE t.id IN "
           "(SELECT target_id FROM infraops_targetmembership WHERE user_id = %s) ORDER BY t.name",
}
_GOAL_CHOICES = {
    True: "SELECT g.id, t.name || ': ' || g.name FROM infraops_goal g "
          "JOIN infraops_target t ON t.id = g.target_id ORDER BY t.name, g.name",
    False: "SELECT g.id, t.name || ': ' || g.name FROM infraops_goal g "
           "JOIN infraops_target t ON t.id = g.target_id WHERE g.target_id IN "
           "(SELECT target_id FROM infraops_targetmembership WHERE user_id = %s) "
           "ORDER BY t.name, g.name",
}


def _choices(statements: dict[bool, str], user: AnyUser) -> list[tuple[Any, str]]:
    if not user.is_authenticated:
        return []
    every = is_superuser(user)
    with connections[router.db_for_read(Goal)].cursor() as cursor:
        cursor.execute(statements[every], [] if every else [user.pk])
        return [(pk, label) for pk, label in cursor.fetchall()]


def _target_choices(user: AnyUser) -> list[tuple[Any, str]]:
    return [("", "any target"), *_choices(_TARGET_CHOICES, user)]


def _goal_choices(user: AnyUser) -> list[tuple[Any, str]]:
    return [("", "any goal"), *_choices(_GOAL_CHOICES, user)]


def _number_field(what: str) -> forms.IntegerField:
    """A row's number, drawn as a select. Not a ModelChoiceField: a fragment request then
    validates without reading the table, and an unknown number simply matches nothing."""
    message = f"a {what} is given by its number."
    return forms.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, widget=forms.Select,
        error_messages={"invalid": message, "min_value": message, "max_value": message})


class QueueFilterForm(forms.Form):
    scope = forms.ChoiceField(
        choices=[("mine", "My queue"), ("all", "All changes")], required=False,
        widget=forms.RadioSelect, error_messages={"invalid_choice": "“%(value)s” is not a view."})
    status = forms.ChoiceField(
        choices=[*Change.Status.choices, (ANY_STATUS, "any status")], required=False,
        error_messages={"invalid_choice": "“%(value)s” is not a status."})
    target = _number_field("target")
    goal = _number_field("goal")
    age = forms.ChoiceField(choices=[("", "any age"), *((k, v[0]) for k, v in AGES.items())],
                            required=False,
                            error_messages={"invalid_choice": "“%(value)s” is not an age."})
    q = forms.CharField(label="Title contains", max_length=200, required=False,
                        widget=forms.SearchInput,
                        error_messages={"max_length": "a search is at most 200 characters."})
    after = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, query: QueryDict, user: AnyUser) -> None:
        data = query.copy()
        for name, default in DEFAULTS.items():  # so the widgets show what applies
            data.setdefault(name, default)
        super().__init__(data)
        # "class" is the parameter's name in URLs, and a keyword in Python.
        self.fields["class"] = forms.ChoiceField(
            choices=[("", "any class"), *((c, c) for c in RISK_CLASSES),
                     (NO_CLASS, "no risk class")],
            required=False, label="Risk class",
            error_messages={"invalid_choice": "“%(value)s” is not a risk class."})
        self.order_fields(["scope", "status", "class", "target", "goal", "age", "q"])
        for name, choices in (("target", _target_choices), ("goal", _goal_choices)):
            # Read only where the form is drawn, and once: a Select iterates its choices
            # twice (the options, and whether the first is empty).
            widget: Any = self.fields[name].widget
            widget.choices = functools.cache(functools.partial(choices, user))

    def clean_status(self) -> str:
        return str(self.cleaned_data.get("status") or Change.Status.PENDING_REVIEW)

    def clean_after(self) -> Cursor | None:
        text = self.cleaned_data.get("after") or ""
        if not text:
            return None
        cursor = parse_cursor(text)
        if cursor is None:
            raise forms.ValidationError("the page link is not one this page made.")
        return cursor

    def filters(self) -> dict[str, Any]:
        """The valid filters with their defaults; an invalid one is left out."""
        self.is_valid()
        data: dict[str, Any] = {**DEFAULTS, "class": "", "target": None, "goal": None,
                                "age": "", "q": "", "after": None}
        data.update({k: v for k, v in self.cleaned_data.items() if v not in (None, "")})
        return data

    def problems(self) -> list[str]:
        names = {"q": "search", "after": "page"}
        return [f"{names.get(field, field)}: {' '.join(str(e) for e in errors)}"
                for field, errors in self.errors.items()]


def parse_cursor(text: str) -> Cursor | None:
    """`<iso datetime with zone>_<id>`, as format_cursor writes it; None if it is not one."""
    stamp, _, pk = text.rpartition("_")
    try:
        when, number = datetime.fromisoformat(stamp), int(pk)
    except ValueError:
        return None
    if when.tzinfo is None or not 0 < number < 2**63:
        return None
    return when, number


def format_cursor(change: Change) -> str:
    return f"{change.created_at.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%fZ}_{change.pk}"


# Each filter's condition on the changes (t0; t1 their target, t2 their goal), with its values
# bound by name. The queue's statement is these conditions joined, built once per process for
# each set of filters in use (a JoinedRead): the ORM built the same query anew on every read,
# for a third of the page's web CPU (bench/load.py). tests/reviews/test_queue.py holds it to
# the ORM's answer for every filter, alone and together.
_CONDITIONS = {
    "member": 't0."target_id" IN (SELECT m.target_id FROM infraops_targetmembership m '
              "WHERE m.user_id = %(user)s)",
    "status": 't0."status" = %(status)s',
    "classes": 't0."risk_classes" && %(classes)s::varchar[]',
    "no_class": "cardinality(t0.\"risk_classes\") = 0",
    "class": 't0."risk_classes" @> ARRAY[%(class)s]::varchar[]',
    "target": 't0."target_id" = %(target)s',
    "goal": 't0."goal_id" = %(goal)s',
    "newer": 't0."created_at" >= %(edge)s',
    "older": 't0."created_at" < %(edge)s',
    "q": 'UPPER(t0."title"::text) LIKE UPPER(%(q)s)',
    # The redundant created_at <= bound lets the index scan start at the cursor instead of
    # filtering every newer row out (the OR alone is not an index condition).
    "after": '(t0."created_at" < %(when)s OR (t0."created_at" = %(when)s AND t0."id" < %(pk)s)) '
             'AND t0."created_at" <= %(when)s',
}
# Only what a row shows: a diff may be megabytes, and 25 of them would dominate the page.
_ROW_FIELDS = {"": ("title", "status", "risk_classes", "gate", "gate_passed", "created_at",
                    "author_label", "target", "goal"), "target": ("name",), "goal": ("name",)}


@functools.cache
def _queue_read(conditions: tuple[str, ...]) -> JoinedRead[Change]:
    return JoinedRead(Change, "target", "goal",
                      where=" AND ".join(_CONDITIONS[name] for name in conditions) or "TRUE",
                      order_by='t0."created_at" DESC, t0."id" DESC', limit=PAGE_SIZE + 1,
                      only=_ROW_FIELDS)


def queue_page(user: AnyUser, filters: dict[str, Any]) -> tuple[list[Change], bool]:
    """The changes the filters select on the user's targets, newest first, after the cursor
    (one query): a page of them, and whether another page follows."""
    values: dict[str, Any] = {}
    if not user.is_authenticated:
        return [], False
    if not is_superuser(user):
        values["member"] = {"user": user.pk}
    if filters["status"] != ANY_STATUS:
        values["status"] = {"status": filters["status"]}
    if filters["scope"] == "mine" and (classes := reviewer_classes(user)):
        values["classes"] = {"classes": list(classes)}
    if filters["class"] == NO_CLASS:
        values["no_class"] = {}
    elif filters["class"]:
        values["class"] = {"class": filters["class"]}
    for name in ("target", "goal"):
        if filters[name] is not None:
            values[name] = {name: filters[name]}
    if filters["age"]:
        edge = timezone.now() - AGES[filters["age"]][1]
        values["newer" if filters["age"].startswith("newer") else "older"] = {"edge": edge}
    if filters["q"]:
        ops = connections[router.db_for_read(Change)].ops  # title__icontains's pattern
        values["q"] = {"q": f"%{ops.prep_for_like_query(filters['q'])}%"}
    if filters["after"] is not None:
        when, pk = filters["after"]
        values["after"] = {"when": when, "pk": pk}
    named = {key: value for bound in values.values() for key, value in bound.items()}
    page = _queue_read(tuple(values)).all(**named)
    return page[:PAGE_SIZE], len(page) > PAGE_SIZE


@dataclass(frozen=True)
class QueueRow:
    change: Change
    age: str
    gate: str
    failing: str


def age_label(created_at: datetime, now: datetime) -> str:
    seconds = max(int((now - created_at).total_seconds()), 0)
    for unit, size in (("y", 365 * 86400), ("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return "just now"


def gate_label(change: Change) -> tuple[str, str]:
    """The gate in words, and the names of the failing checks."""
    failing = [str(check.get("name", "?")) for check in change.failing_checks]
    if failing:
        return f"{len(failing)} check{'s' if len(failing) > 1 else ''} failing", ", ".join(failing)
    if change.review_checks:
        return "review required", ""
    if change.gate_passed:
        return "gate passed", ""
    return "gate not run", ""


def queue_rows(changes: list[Change]) -> list[QueueRow]:
    now = timezone.now()
    return [QueueRow(change, age_label(change.created_at, now), *gate_label(change))
            for change in changes]


def page_links(query: QueryDict, problems: set[str], last: Change | None) -> dict[str, str]:
    """Query strings of the next and first pages: the same valid filters, another cursor."""
    kept = query.copy()
    for name in (*problems, "after"):
        kept.pop(name, None)
    links = {"first_query": kept.urlencode()}
    if last is not None:
        kept["after"] = format_cursor(last)
        links["next_query"] = kept.urlencode()
    return links


def _unfiltered(filters: dict[str, Any]) -> bool:
    return filters["status"] == DEFAULTS["status"] and not any(
        filters[name] for name in ("class", "target", "goal", "age", "q"))


def _wants_table(request: AuthenticatedHttpRequest) -> bool:
    """htmx swaps of the table get the partial; boosted links and history restores (whose
    target is the whole page) get the page."""
    htmx = request.htmx
    return (bool(htmx) and not htmx.boosted and not htmx.history_restore_request
            and htmx.target in (None, "queue-table"))


def queue(request: AuthenticatedHttpRequest) -> HttpResponse:
    require_any_role(request)
    form = QueueFilterForm(request.GET, request.user)
    filters = form.filters()
    page, more = queue_page(request.user, filters)
    context = {
        "form": form, "filters": filters, "problems": form.problems(), "rows": queue_rows(page),
        "my_classes": reviewer_classes(request.user), "paged": filters["after"] is not None,
        "unfiltered": _unfiltered(filters),
        **page_links(request.GET, set(form.errors), page[-1] if more else None),
    }
    template = "reviews/queue.html#queue-table" if _wants_table(request) else "reviews/queue.html"
    return render(request, template, context)
