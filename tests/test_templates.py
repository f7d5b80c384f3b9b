"""No line of a template runs past 200 characters: a longer one hides its markup from review
and its changes from a diff. A long line is re-flowed where a line break changes nothing the
page shows (between a tag's attributes, between block elements, for a space in text), never
inside a {% %} or {{ }} tag, an attribute's value or a <pre>; output that must stay on one line
is split into partials instead (agents/run.html's run-event)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

LIMIT = 200
TEMPLATES = Path(settings.BASE_DIR) / "templates"
FILES = sorted(path for path in TEMPLATES.rglob("*") if path.is_file())


def long_lines(name: str, text: str, limit: int = LIMIT) -> list[str]:
    """`name:line (length)` for each line of `text` longer than `limit` characters."""
    return [f"{name}:{number} ({len(line)})"
            for number, line in enumerate(text.split("\n"), 1) if len(line) > limit]


@pytest.mark.parametrize(("text", "found"), [
    ("", []),
    ("x" * 200, []),
    ("x" * 201, ["t.html:1 (201)"]),
    ("x" * 200 + "\n", []),
    ("é" * 201, ["t.html:1 (201)"]),  # characters, not bytes
    ("short\n" + "y" * 250 + "\nshort\n" + "z" * 201 + "\n",
     ["t.html:2 (250)", "t.html:4 (201)"]),
])
def test_each_line_over_the_limit_is_named_with_its_number_and_length(
        text: str, found: list[str]) -> None:
    assert long_lines("t.html", text) == found


def test_the_templates_are_found() -> None:
    names = {path.relative_to(TEMPLATES).as_posix() for path in FILES}
    assert {"base.html", "agents/run.html", "admin/edit_inline/tabular_labelled.html"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.relative_to(TEMPLATES).as_posix())
def test_no_template_line_is_over_200_characters(path: Path) -> None:
    name = path.relative_to(settings.BASE_DIR).as_posix()
    found = long_lines(name, path.read_text(encoding="utf-8"))
    assert not found, f"lines over {LIMIT} characters: " + ", ".join(found)
