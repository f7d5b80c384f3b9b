"""reviews.risk.classify on the labelled corpus: every diff gets exactly its labelled classes.

The corpus (tests/reviews/risk_corpus/, index.toml) holds diffs as `git diff` prints them,
each modelled on a public fix (the index names it) or a harmless change (docs, tests, renames,
comments). A diff's labels are the set of classes a reviewer must be asked about; harmless
diffs have none and must get no finding at all. bench/risk_corpus.py prints the same results
as recall and precision per class.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from reviews.risk import CONCURRENCY, NUMERICS, PRODUCTION, UNCLASSIFIED, classify, risk_classes
from reviews.risk.diff import parse_diff

CORPUS = Path(__file__).parent / "risk_corpus"
INDEX = tomllib.loads((CORPUS / "index.toml").read_text())["diff"]
CLASSES = {NUMERICS, CONCURRENCY, PRODUCTION, UNCLASSIFIED}


def slug(entry: dict[str, Any]) -> str:
    return str(entry["file"]).removesuffix(".diff")


# Mismatches the rules do not fix yet (index.toml's `open` key says why): expected to fail,
# strictly, so that the entry loses its key when a rule fixes it.
LABELLED = [pytest.param(entry, marks=pytest.mark.xfail(reason=str(entry["open"]), strict=True))
            if "open" in entry else entry for entry in INDEX]


@pytest.mark.parametrize("entry", LABELLED, ids=slug)
def test_a_corpus_diff_gets_exactly_its_labelled_classes(entry: dict[str, Any]) -> None:
    diff = (CORPUS / str(entry["file"])).read_text()

    findings = classify(diff)

    assert risk_classes(findings) == sorted(entry["labels"]), [
        (f.category, f.rule, f.path, f.line, f.reason) for f in findings]


@pytest.mark.parametrize("entry", INDEX, ids=slug)
def test_a_corpus_finding_names_a_changed_line_of_its_file(entry: dict[str, Any]) -> None:
    diff = (CORPUS / str(entry["file"])).read_text()
    changed = {(change.path, line.number, line.kind)
               for change in parse_diff(diff) for hunk in change.hunks for line in hunk.lines
               if line.kind != "context"}
    paths = {change.path for change in parse_diff(diff)}

    for finding in classify(diff):
        assert finding.path in paths
        assert finding.reason and finding.rule
        if finding.line is None:
            assert finding.side == "file"
        else:
            assert (finding.path, finding.line, finding.side) in changed


def test_the_corpus_covers_every_class_and_many_harmless_diffs() -> None:
    labels = [set(entry["labels"]) for entry in INDEX]

    assert len(INDEX) >= 80
    assert sum(1 for label in labels if not label) >= 20
    assert all(label <= CLASSES for label in labels)
    assert all(sum(1 for label in labels if cls in label) >= 4 for cls in CLASSES)
    assert sum(1 for label in labels if len(label) >= 2) >= 5
    assert all(entry["modelled_on"] for entry in INDEX)
    assert all(str(entry["open"]).strip() for entry in INDEX if "open" in entry)


def test_the_index_names_every_diff_of_the_corpus_once() -> None:
    named = [str(entry["file"]) for entry in INDEX]

    assert sorted(named) == sorted(path.name for path in CORPUS.glob("*.diff"))
    assert len(set(named)) == len(named)


VALIDATION = CORPUS / "validation"
HELD_OUT = tomllib.loads((VALIDATION / "index.toml").read_text()).get("diff", [])


def test_the_validation_set_is_apart_and_names_a_real_commit_for_each_diff() -> None:
    named = [str(entry["file"]) for entry in HELD_OUT]
    labels = [set(entry["labels"]) for entry in HELD_OUT]

    assert sorted(named) == sorted(path.name for path in VALIDATION.glob("*.diff"))
    if not HELD_OUT:
        pytest.skip("no validation diffs: the previous held-out set moved into the training "
                    "corpus (issue 27) and validation/ awaits the next blind set")
    assert not set(named) & {str(entry["file"]) for entry in INDEX}
    assert all(label <= CLASSES for label in labels)
    assert all(re.search(r"\b[0-9a-f]{7,40}\b", entry["modelled_on"]) for entry in HELD_OUT)
