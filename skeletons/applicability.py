"""When a skeleton applies: its conditions as checkable predicates over what is known of a
probe, and the facts an experiment measured. Pure: no Django.

A predicate is ``{"field": name, "op": op, "value": value}``:

- ``field`` follows the manifest's meta key rule (``op_class``, ``dtype``, ``seq_len``); the
  probe's own ``probe``, ``layer`` and ``covers`` and the measured ``bottleneck`` are fields
  too (see ``probe_metadata`` and ``measured_facts``);
- ``op`` is one of OPS: ``eq``/``ne`` take a string, number or boolean; ``in``/``not_in`` a
  non-empty list of strings or numbers; ``<``, ``<=``, ``>``, ``>=`` a number.

Contracts:

* ``predicate_problems`` names every problem of a list of predicates, one sentence each
  ("condition 2: op 'like' is not one of ..."); ``validate_predicates`` raises
  ``PredicateError`` carrying them. Nothing else escapes either, whatever the input.
* ``evaluate`` gives one ``Check`` per predicate: met, not met, or unknown. A field the
  metadata lacks (or holds no value for) is **unknown**, said so, never silently true; a
  numeric condition on a value that is no number is unknown too.
* A field holding a list (``seq_len = [1024, 65536]``, several bottlenecks) meets ``eq``,
  ``in`` and the comparisons when any of its values does, and ``ne``/``not_in`` when none
  does. Text is compared without regard to case; numbers as numbers ("1024" is 1024).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from infraops.manifest import (
    MAX_META_ITEMS,
    MAX_META_TEXT,
    META_KEY_RE,
    META_KEY_RULE,
    MetaValue,
    Probe,
)

OPS = {"eq": "is", "ne": "is not", "in": "is one of", "not_in": "is none of",
       "<": "<", "<=": "≤", ">": ">", ">=": "≥"}
NUMERIC_OPS = ("<", "<=", ">", ">=")
LIST_OPS = ("in", "not_in")
PREDICATE_KEYS = ("field", "op", "value")
MAX_PREDICATES = 20

MET, NOT_MET, UNKNOWN = "met", "not met", "unknown"

# Bottlenecks the feedback measures (measured_facts); a probe's meta may declare others
# ("compute", "memory") that only a person or a profiler knows.
PRECISION = "precision"
SERIALIZED = "serialized-threads"

Scalar = str | int | float | bool
Metadata = Mapping[str, Any]


class PredicateError(ValueError):
    """The predicates are unusable; ``problems`` says why, one sentence each."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class Predicate:
    field: str
    op: str
    value: Any

    def describe(self) -> str:
        """The condition in words: 'dtype is one of fp32, tf32', 'seq_len ≥ 1024'."""
        return f"{self.field} {OPS[self.op]} {_show(self.value)}"

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "op": self.op, "value": self.value}


@dataclass(frozen=True)
class Check:
    """One predicate against the metadata: its state (MET, NOT_MET, UNKNOWN) and why."""

    predicate: Predicate
    state: str
    reason: str

    def __str__(self) -> str:
        return f"{self.predicate.describe()}: {self.state} ({self.reason})"


@dataclass(frozen=True)
class Fact:
    """A measured fact: `field` has `value`, because of `source` (an experiment's finding)."""

    field: str
    value: str
    source: str


# --------------------------------------------------------------------------- validation


def predicate_problems(raw: object) -> list[str]:
    """Every problem of `raw` as a list of predicates, in words; [] when it is usable."""
    if not isinstance(raw, list):
        return ['the conditions must be a list of objects like {"field": "dtype", "op": '
                f'"eq", "value": "tf32"}}, not {_kind(raw)}']
    if len(raw) > MAX_PREDICATES:
        return [f"at most {MAX_PREDICATES} conditions, not {len(raw)}"]
    problems = []
    for number, item in enumerate(raw, start=1):
        problems += [f"condition {number}: {problem}" for problem in _problems_of(item)]
    return problems


def validate_predicates(raw: object) -> list[Predicate]:
    """The predicates of `raw`; PredicateError naming every problem when it has any."""
    problems = predicate_problems(raw)
    if problems:
        raise PredicateError(problems)
    assert isinstance(raw, list)
    return [Predicate(item["field"], item["op"], _stored(item["value"])) for item in raw]


def describe_conditions(raw: object) -> list[str]:
    """The conditions in words, one line each. A stored list that no longer validates (edited
    by hand in the database) is shown as its problems: a page must still render it."""
    try:
        return [predicate.describe() for predicate in validate_predicates(raw)]
    except PredicateError as exc:
        return [f"not checkable: {problem}" for problem in exc.problems]


def _problems_of(item: object) -> list[str]:
    if not isinstance(item, dict):
        return [f"must be an object with {', '.join(PREDICATE_KEYS)}, not {_kind(item)}"]
    problems = [f"unknown key {str(key)[:40]!r}; a condition has only "
                f"{', '.join(PREDICATE_KEYS)}" for key in item if key not in PREDICATE_KEYS]
    problems += [f"{key} is missing" for key in PREDICATE_KEYS if key not in item]
    field, op = item.get("field"), item.get("op")
    if "field" in item and not (isinstance(field, str) and META_KEY_RE.fullmatch(field)):
        problems.append(f"field {_clip(field)} must be {META_KEY_RULE}")
    if "op" in item and not (isinstance(op, str) and op in OPS):
        problems.append(f"op {_clip(op)} is not one of {', '.join(OPS)}")
    elif "op" in item and "value" in item:
        problems += _value_problems(str(op), item["value"])
    return problems


def _value_problems(op: str, value: object) -> list[str]:
    if op in NUMERIC_OPS:
        return [] if _is_number(value) and math.isfinite(value) else [
            f"op {op!r} compares numbers: value must be a finite number, not {_kind(value)}"]
    if op in LIST_OPS:
        if not isinstance(value, list) or not 0 < len(value) <= MAX_META_ITEMS:
            got = f"{len(value)} values" if isinstance(value, list) else _kind(value)
            return [f"op {op!r} needs a list of 1 to {MAX_META_ITEMS} values, not {got}"]
        return [f"value {n}: {problem}" for n, item in enumerate(value, start=1)
                if (problem := _scalar_problem(item, booleans=False))]
    problem = _scalar_problem(value, booleans=True)
    return [f"value: {problem}"] if problem else []


def _scalar_problem(value: object, *, booleans: bool) -> str | None:
    if isinstance(value, bool):
        return None if booleans else "must be a string or a number, not a boolean"
    if _is_number(value):
        return None if math.isfinite(value) else "must be a finite number"
    if isinstance(value, str):
        ok = value.strip() and len(value) <= MAX_META_TEXT
        return None if ok else f"must be a non-empty text of at most {MAX_META_TEXT} characters"
    return f"must be a string{', boolean' if booleans else ''} or a number, not {_kind(value)}"


def _stored(value: Any) -> Any:
    return list(value) if isinstance(value, list | tuple) else value


# --------------------------------------------------------------------------- evaluation


def evaluate(predicates: Iterable[Predicate], metadata: Metadata) -> list[Check]:
    """One Check per predicate, in order."""
    return [_check(predicate, metadata) for predicate in predicates]


def matches(predicates: Iterable[Predicate], metadata: Metadata) -> tuple[bool, list[Check]]:
    """(whether every predicate is met, the checks). An unknown predicate is not met: the
    checks say which were unknown, so a caller may still offer what nothing rules out."""
    checks = evaluate(predicates, metadata)
    return all(check.state == MET for check in checks), checks


def ruled_out(checks: Iterable[Check]) -> bool:
    """Whether some predicate is known not to hold."""
    return any(check.state == NOT_MET for check in checks)


def _check(predicate: Predicate, metadata: Metadata) -> Check:
    values = _values(metadata.get(predicate.field))
    if not values:
        return Check(predicate, UNKNOWN, f"no {predicate.field} is known for this probe")
    shown = _show(values if len(values) > 1 else values[0])
    if predicate.op in NUMERIC_OPS:
        numbers = [number for number in map(_number, values) if number is not None]
        if not numbers:
            return Check(predicate, UNKNOWN, f"{predicate.field} is {shown}, not a number")
        held = any(_compare(predicate.op, number, float(predicate.value)) for number in numbers)
    else:
        wanted = predicate.value if predicate.op in LIST_OPS else [predicate.value]
        found = any(_same(value, want) for value in values for want in wanted)
        held = found if predicate.op in ("eq", "in") else not found
    return Check(predicate, MET if held else NOT_MET, f"{predicate.field} is {shown}")


def _values(value: object) -> list[Scalar]:
    """The metadata's value as a list of scalars; [] for none."""
    if value is None:
        return []
    items = list(value) if isinstance(value, list | tuple | set | frozenset) else [value]
    return [item for item in items if isinstance(item, str | int | float | bool)]


def _compare(op: str, left: float, right: float) -> bool:
    return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[op]


def _same(value: Scalar, wanted: Scalar) -> bool:
    if isinstance(value, bool) or isinstance(wanted, bool):
        return _text(value) == _text(wanted)
    left, right = _number(value), _number(wanted)
    if left is not None and right is not None:
        return left == right
    return _text(value) == _text(wanted)


def _number(value: Scalar) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _text(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip().casefold()


# --------------------------------------------------------------------------- metadata


def probe_metadata(probe: Probe) -> dict[str, MetaValue | list[str]]:
    """What a probe's manifest entry says: its name, layer and covered globs, and its meta."""
    return {"probe": probe.name, "layer": probe.layer, "covers": list(probe.covers),
            **probe.meta}


def measured_facts(feedbacks: Iterable[tuple[int, Mapping[str, Any]]],
                   probe: str | None = None) -> list[Fact]:
    """The bottlenecks experiments measured, from their feedback ((experiment id, feedback)
    pairs), about `probe` (every probe when None): an error that grows with the input's size
    is a precision bottleneck; two threads whose spans never overlap are serialized threads
    (a lock or the GIL held across a wait). Findings about the baseline count: the slow or
    wrong code is what a skeleton is applied to. Each fact once, with its first source."""
    facts: dict[tuple[str, str], Fact] = {}
    for experiment, feedback in feedbacks:
        for finding in _findings(feedback):
            evidence = finding.get("evidence") or {}
            if probe is not None and evidence.get("probe") not in (None, probe):
                continue
            value = _bottleneck(finding)
            if value is not None:
                source = f"experiment {experiment}: {str(finding.get('title', ''))[:200]}"
                facts.setdefault(("bottleneck", value), Fact("bottleneck", value, source))
    return list(facts.values())


def with_facts(metadata: Mapping[str, Any], facts: Iterable[Fact]) -> dict[str, Any]:
    """The metadata with the measured facts added to what it declares (a list per field)."""
    merged = dict(metadata)
    for fact in facts:
        known = _values(merged.get(fact.field))
        if not any(_same(value, fact.value) for value in known):
            merged[fact.field] = [*known, fact.value]
    return merged


def draft_conditions(probe: Probe | None, facts: Iterable[Fact]) -> list[dict[str, Any]]:
    """Conditions to start a proposed skeleton with, from what was true where it worked: the
    probe's layer and declared op_class and dtype, and the bottlenecks measured. A person
    widens or removes them before promoting the draft."""
    conditions: list[dict[str, Any]] = []
    if probe is not None:
        conditions.append({"field": "layer", "op": "eq", "value": probe.layer})
        conditions += [{"field": key, "op": "eq", "value": probe.meta[key]}
                       for key in ("op_class", "dtype") if isinstance(probe.meta.get(key), str)]
    bottlenecks = list(dict.fromkeys(f.value for f in facts if f.field == "bottleneck"))
    if bottlenecks:
        conditions.append({"field": "bottleneck", "op": "in", "value": bottlenecks})
    return conditions


def _findings(feedback: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    """The findings, and the baseline's findings a 'fixed' or 'fails on the baseline too'
    finding carries in its evidence."""
    for finding in feedback.get("findings") or ():
        if not isinstance(finding, Mapping):
            continue
        yield finding
        for inner in (finding.get("evidence") or {}).get("baseline") or ():
            if isinstance(inner, Mapping):
                yield inner


def _bottleneck(finding: Mapping[str, Any]) -> str | None:
    kind = finding.get("kind")
    if kind == "no-overlap":
        return SERIALIZED
    # A growing error is its own finding, or folded into the failing cases it explains
    # (infraops.feedback.findings.by_root_cause).
    series = (finding.get("evidence") or {}).get("series") or {}
    if (kind == "error-vs-size" or finding.get("layer") == "correctness") and isinstance(
            series, Mapping) and series.get("growing"):
        return PRECISION
    return None


# --------------------------------------------------------------------------- words


def _show(value: object) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(_show(item) for item in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _clip(value: object) -> str:
    text = repr(value) if isinstance(value, str) else _kind(value)
    return text if len(text) <= 42 else text[:40] + "..."


def _kind(value: object) -> str:
    names = [(bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a text"),
             (list, "a list"), (dict, "an object")]
    return next((name for kind, name in names if isinstance(value, kind)), "null")


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
