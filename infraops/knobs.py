"""The tuner's knob editor: read, write and list the values of a manifest's ``[[knob]]``.

A knob (infraops.manifest.Knob) names one value in one file of the target: a regular
expression whose single group is the value. Writing a value changes nothing else in the
file, and refuses a value the knob does not allow or an edit that would not read back.
Plain functions on text: the caller reads and writes the file.
"""

from __future__ import annotations

import re
from decimal import Context, Decimal, InvalidOperation, localcontext

from infraops.manifest import Knob

MAX_KNOB_VALUES = 10_000

# Exact decimal steps: enough digits that listing or checking a stepped range does not round.
_DECIMALS = Context(prec=80)


def knob_read(knob: Knob, text: str) -> str:
    """The knob's current value in ``text`` (the content of ``knob.file``).

    Raises ValueError, naming the knob and the file, unless the pattern matches exactly once
    and its group takes part in that match.
    """
    match = _single_match(knob, text)
    return match.group(1)


def knob_apply(knob: Knob, text: str, value: str) -> str:
    """``text`` with the knob's value replaced by ``value``; nothing else changes.

    Raises ValueError when ``value`` is not allowed (not one of ``values``; outside ``range``,
    off its step, or not a whole number for a whole-number range), when the pattern does not
    match exactly once, or when the result would not read back as ``value``.
    """
    problem = _knob_value_problem(knob, value)
    if problem is not None:
        raise ValueError(f"knob {knob.name!r}: value {value!r} {problem}")
    match = _single_match(knob, text)
    result = text[: match.start(1)] + value + text[match.end(1) :]
    # A value can itself create or break a match (e.g. one containing the pattern's text).
    try:
        readback = knob_read(knob, result)
    except ValueError:
        readback = None
    if readback != value:
        raise ValueError(
            f"knob {knob.name!r}: after writing {value!r} into {knob.file} the pattern no "
            "longer reads it back exactly once; refusing the edit"
        )
    return result


def knob_values(knob: Knob) -> list[str]:
    """Every allowed value as the string knob_apply writes.

    A stepped range is enumerated from low to high (inclusive) in exact decimal steps; a
    continuous range, or one with more than MAX_KNOB_VALUES values, raises ValueError.
    """
    if knob.values is not None:
        return list(knob.values)
    if knob.range is None:
        raise ValueError(f"knob {knob.name!r} has neither values nor range")
    low, high, step = knob.range
    if step is None:
        raise ValueError(
            f"knob {knob.name!r} is continuous (range [{low}, {high}] without a step); "
            "it has no finite list of values"
        )
    start, stop, stride = _decimal(low), _decimal(high), _decimal(step)
    with localcontext(_DECIMALS):
        try:
            count = int((stop - start) // stride) + 1
        except InvalidOperation:  # the quotient has more digits than the context holds
            count = MAX_KNOB_VALUES + 1
    if count > MAX_KNOB_VALUES:
        raise ValueError(
            f"knob {knob.name!r} has {count} values (more than {MAX_KNOB_VALUES}); "
            "search its range instead of listing it"
        )
    whole = _is_whole_range(knob.range)
    with localcontext(_DECIMALS):
        return [_format_decimal(start + stride * k, whole=whole) for k in range(count)]


def _single_match(knob: Knob, text: str) -> re.Match[str]:
    matches = list(re.compile(knob.pattern, re.MULTILINE).finditer(text))
    if len(matches) != 1:
        lines = ", ".join(str(text.count("\n", 0, m.start()) + 1) for m in matches[:5])
        where = f" (lines {lines})" if matches else ""
        raise ValueError(
            f"knob {knob.name!r}: pattern {knob.pattern!r} matched {len(matches)} times in "
            f"{knob.file}{where}; it must match exactly once"
        )
    if matches[0].group(1) is None:
        raise ValueError(
            f"knob {knob.name!r}: pattern {knob.pattern!r} matched in {knob.file} but its "
            "value group took no part in the match"
        )
    return matches[0]


def _knob_value_problem(knob: Knob, value: str) -> str | None:
    if knob.values is not None:
        if value in knob.values:
            return None
        return f"is not allowed; allowed: {', '.join(knob.values)}"
    if knob.range is None:
        return "cannot be checked: the knob has neither values nor range"
    low, high, step = knob.range
    whole = _is_whole_range(knob.range)
    if whole and not re.fullmatch(r"[+-]?[0-9]+", value):
        return "is not a whole number"
    if value != value.strip():
        return "has surrounding whitespace"
    try:
        number = Decimal(value)
    except InvalidOperation:
        return "is not a number"
    if not number.is_finite():
        return "is not a finite number"
    if not _decimal(low) <= number <= _decimal(high):
        return f"is outside the range [{low}, {high}]"
    if step is None:
        return None
    with localcontext(_DECIMALS):
        try:
            on_step = (number - _decimal(low)) % _decimal(step) == 0
        except InvalidOperation:  # too many digits to tell: refuse rather than round
            on_step = False
    return None if on_step else f"is not on a step of {step} from {low}"



def _decimal(number: float) -> Decimal:
    # repr gives the shortest text that round-trips, so 0.1 stays 0.1 and steps add exactly.
    return Decimal(repr(number)) if isinstance(number, float) else Decimal(number)


def _is_whole_range(bounds: tuple[float, float, float | None]) -> bool:
    return all(isinstance(bound, int) for bound in bounds if bound is not None)


def _format_decimal(number: Decimal, *, whole: bool) -> str:
    if whole:
        return str(int(number))
    text = format(number.normalize(), "f")
    # Keep float knobs looking like floats: 1.0, not 1, whatever the target's language.
    return text if "." in text else f"{text}.0"
