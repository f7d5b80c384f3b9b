"""infraops/knobs.py: a knob reads, writes and lists exactly its value, and refuses the rest."""

from __future__ import annotations

import pytest

from infraops.knobs import knob_apply, knob_read, knob_values
from infraops.manifest import Knob

CONFIG = "# tuning\nBLOCK_SIZE = 64\nSCALE = 0.5\nMODE = 'fast'\n"


@pytest.mark.parametrize(("knob", "before", "after"), [
    (Knob("mode", "c.py", r"^MODE = '(\w+)'$", values=("fast", "exact")), "fast", "exact"),
    (Knob("block", "c.py", r"^BLOCK_SIZE = (\d+)$", range=(16, 256, 16)), "64", "128"),
    (Knob("scale", "c.py", r"^SCALE = ([\d.]+)$", range=(0.0, 1.0, None)), "0.5", "0.125"),
    (Knob("scale", "c.py", r"^SCALE = ([\d.]+)$", range=(0.1, 0.9, 0.1)), "0.5", "0.3"),
])
def test_a_knob_reads_and_applies_round_trip(knob: Knob, before: str, after: str) -> None:
    assert knob_read(knob, CONFIG) == before
    changed = knob_apply(knob, CONFIG, after)
    assert knob_read(knob, changed) == after
    assert changed.replace(after, before, 1) == CONFIG
    assert knob_apply(knob, changed, before) == CONFIG


@pytest.mark.parametrize(("knob", "value", "phrase"), [
    (Knob("mode", "c.py", r"^MODE = '(\w+)'$", values=("fast", "exact")), "slow", "not allowed"),
    (Knob("block", "c.py", r"^BLOCK_SIZE = (\d+)$", range=(16, 256, 16)), "50", "not on a step"),
    (Knob("block", "c.py", r"^BLOCK_SIZE = (\d+)$", range=(16, 256, 16)), "512", "outside"),
    (Knob("block", "c.py", r"^BLOCK_SIZE = (\d+)$", range=(16, 256, 16)), "64.0", "whole number"),
    (Knob("block", "c.py", r"^BLOCK_SIZE = (\d+)$", range=(16, 256, None)), "1e2", "whole number"),
    (Knob("scale", "c.py", r"^SCALE = ([\d.]+)$", range=(0.1, 0.9, 0.1)), "0.35", "not on a step"),
    (Knob("scale", "c.py", r"^SCALE = ([\d.]+)$", range=(0.0, 1.0, None)), "abc", "not a number"),
    (Knob("scale", "c.py", r"^SCALE = ([\d.]+)$", range=(0.0, 1.0, None)), "nan", "not a finite"),
    (Knob("scale", "c.py", r"^SCALE = ([\d.]+)$", range=(0.0, 1.0, None)), " 0.5", "whitespace"),
    (Knob("twice", "c.py", r"^(\w+) = ", values=("X",)), "X", "matched 3 times in c.py"),
    (Knob("never", "c.py", r"^NOPE = (\d+)$", values=("1",)), "1", "matched 0 times"),
    (Knob("grows", "c.py", r"^MODE = '([^']*)'", values=("a'\nMODE = 'b",)),
     "a'\nMODE = 'b", "no longer reads it back"),
])
def test_a_knob_refuses_a_bad_value_or_an_ambiguous_file(
    knob: Knob, value: str, phrase: str,
) -> None:
    with pytest.raises(ValueError, match=phrase):
        knob_apply(knob, CONFIG, value)


def test_knob_read_names_the_lines_of_a_pattern_matching_twice() -> None:
    knob = Knob("n", "c.py", r"^(\w+) = ", values=("X",))
    with pytest.raises(ValueError, match=r"knob 'n'.*\(lines 2, 3, 4\).*exactly once"):
        knob_read(knob, CONFIG)


def test_knob_read_refuses_a_group_that_took_no_part() -> None:
    knob = Knob("n", "c.py", r"^BLOCK_SIZE = (?:(x)|\d+)$", values=("x",))
    with pytest.raises(ValueError, match="took no part"):
        knob_read(knob, CONFIG)


@pytest.mark.parametrize(("knob", "values"), [
    (Knob("k", "c.py", "(x)", values=("b", "a")), ["b", "a"]),
    (Knob("k", "c.py", "(x)", range=(16, 64, 16)), ["16", "32", "48", "64"]),
    (Knob("k", "c.py", "(x)", range=(1, 10, 4)), ["1", "5", "9"]),
    (Knob("k", "c.py", "(x)", range=(0.1, 0.5, 0.1)), ["0.1", "0.2", "0.3", "0.4", "0.5"]),
    (Knob("k", "c.py", "(x)", range=(0, 1, 0.5)), ["0.0", "0.5", "1.0"]),
])
def test_knob_values_enumerates_exactly(knob: Knob, values: list[str]) -> None:
    assert knob_values(knob) == values


def test_every_enumerated_knob_value_can_be_applied() -> None:
    knob = Knob("scale", "c.py", r"^SCALE = ([\d.]+)$", range=(0.1, 0.9, 0.1))
    for value in knob_values(knob):
        assert knob_read(knob, knob_apply(knob, CONFIG, value)) == value


@pytest.mark.parametrize(("knob", "phrase"), [
    (Knob("k", "c.py", "(x)", range=(0.0, 1.0, None)), "continuous"),
    (Knob("k", "c.py", "(x)", range=(0, 10**9, 1)), "more than 10000"),
    (Knob("k", "c.py", "(x)", range=(0.0, 1e300, 1e-300)), "more than 10000"),
])
def test_knob_values_refuses_ranges_it_cannot_list(knob: Knob, phrase: str) -> None:
    with pytest.raises(ValueError, match=phrase):
        knob_values(knob)
