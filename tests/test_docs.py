"""The documentation tells the truth about this repository: it stands on its own (no reference
to documents that live outside it, or to files under names they no longer have), every
repository path README.md and docs/*.md name in backticks exists, and every relative link in
them reaches a file and, where it names one, a heading. Plain functions: no database."""

from __future__ import annotations

import itertools
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

# What the old references named, and where the fact lives in the repository now.
STALE_REFERENCES = {
    "ARCHITECTURE.md": 'docs/product.md ("Decisions already taken") or docs/architecture.md',
    "PRODUCT.md": "docs/product.md",
    "STYLE.md": "docs/style.md (same rule numbers)",
    "RELIABILITY.md": "docs/reliability.md (the list, with the tests that hold it)",
    "../shared": "the in-repository docs/ page",
    "/work/shared": "the in-repository docs/ page",
    "docs/feedback.md": "docs/feedback-contract.md",
    "infraops/embedded.py": "infraops/management/commands/standalone.py",
    "agents/llm_step.py": "agents/policies/llm.py",
    "agents/tools.py": "agents/tools/ (one module per job)",
    # Before the core was split into rooms (docs/architecture.md, "The house").
    "infraops/settings.py": "infraops/project/settings.py",
    "infraops/celery.py": "infraops/project/celery.py",
    "infraops/sandbox.py": "infraops/experiments/sandbox/",
    "infraops/services/experiments.py": "infraops/experiments/services.py",
    "infraops/services/feedback.py": "infraops/experiments/analysis.py",
    "infraops/feedback.py": "infraops/feedback/findings.py",
    "infraops/stats.py": "infraops/feedback/stats.py",
    "infraops/skeletons.py": "skeletons/models.py",
    "agents/tools/workspace.py": "agents/tools/workspace/",
    "-A infraops ": "-A infraops.project",
}

PATH_SUFFIXES = (".py", ".md", ".sh", ".toml", ".html", ".js", ".css")
FOLDER = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/")
SKIP_MARKS = ("<", "*", "…")
# Paths the docs name that are not this checkout's, on purpose: made at run time, or examples of
# a target repository's layout. Everything else that looks like a path must exist.
NOT_THIS_CHECKOUT = {
    ".infraops/": "the default data folder, made by the first start (git-ignored)",
    "outputs/": "the folder a probe writes its outputs to, inside INFRAOPS_OUT",
    **dict.fromkeys(
        ("k8s/", "kubernetes/", "manifests/", "deploy/", "deployment/", "infra/", "ansible/",
         "config/serving.toml"),
        "a target repository's path that the risk classifier recognises (docs/risk.md)"),
}

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
BRACES = re.compile(r"\{([^{}]*,[^{}]*)\}")


def repository_files() -> list[str]:
    """Tracked files plus the new ones not ignored (about to be tracked), that exist on disk."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True, timeout=60,
    ).stdout.decode()
    names = sorted({name for name in listed.split("\0") if name})
    return [name for name in names if (ROOT / name).is_file()]


def text_of(name: str) -> str | None:
    """The file's text, or None for a binary file."""
    raw = (ROOT / name).read_bytes()
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def documents() -> list[str]:
    return ["README.md", *sorted(p.relative_to(ROOT).as_posix()
                                 for p in (ROOT / "docs").glob("*.md"))]


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def without_fences(text: str) -> str:
    """Fenced code blocks blanked out, each character but a newline by a space, so offsets and
    line numbers stay those of the text."""
    return FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def expand_braces(token: str) -> list[str]:
    """`infraops/services/{targets,goals}.py` -> both paths; a token without a list of
    alternatives in braces is itself."""
    parts = BRACES.split(token)
    if len(parts) == 1:
        return [token]
    fixed, choices = parts[0::2], [group.split(",") for group in parts[1::2]]
    expanded = []
    for picked in itertools.product(*choices):
        pieces = [fixed[0]]
        for choice, rest in zip(picked, fixed[1:], strict=True):
            pieces += [choice.strip(), rest]
        expanded.append("".join(pieces))
    return expanded


def looks_like_repository_path(token: str) -> bool:
    if any(mark in token for mark in SKIP_MARKS) or "{" in token or "}" in token:
        return False
    if token.startswith(("/", "~", "http")) or "://" in token:
        return False
    if "/" in token and token.endswith(PATH_SUFFIXES):
        return True
    return FOLDER.fullmatch(token) is not None


def backticked_paths(text: str) -> Iterator[tuple[int, str]]:
    """(line, path) for every repository-looking path inside a code span."""
    for span in CODE_SPAN.finditer(without_fences(text)):
        for word in span.group(2).split():
            for token in expand_braces(word):
                if looks_like_repository_path(token):
                    yield line_of(text, span.start(2)), token


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings of a markdown text."""
    anchors = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", without_fences(text), re.MULTILINE):
        plain = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
        anchors.add(re.sub(r"[^\w\- ]", "", plain).replace(" ", "-"))
    return anchors


def test_no_file_refers_to_documents_outside_the_repository_or_to_old_names() -> None:
    offenders = []
    for name in repository_files():
        text = None if name == THIS else text_of(name)
        for number, line in enumerate((text or "").splitlines(), start=1):
            offenders += [f"{name}:{number}: {stale!r} -> use {home}"
                          for stale, home in STALE_REFERENCES.items() if stale in line]
    assert not offenders, ("references to documents outside the repository or to old names:\n"
                           + "\n".join(offenders))


def test_every_path_the_docs_name_in_backticks_exists() -> None:
    offenders = []
    for doc in documents():
        for line, path in backticked_paths((ROOT / doc).read_text(encoding="utf-8")):
            if path not in NOT_THIS_CHECKOUT and not (ROOT / path).exists():
                offenders.append(f"{doc}:{line}: `{path}`")
    assert not offenders, ("paths named in the docs that are not in the checkout:\n"
                           + "\n".join(offenders))


def test_every_relative_link_in_the_docs_reaches_a_file_and_its_heading() -> None:
    offenders = []
    for doc in documents():
        text = (ROOT / doc).read_text(encoding="utf-8")
        for link in LINK.finditer(without_fences(text)):
            target, _, anchor = link.group(1).partition("#")
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            where = f"{doc}:{line_of(text, link.start())}: ({link.group(1)})"
            file = (ROOT / doc).parent / target if target else ROOT / doc
            if not file.exists():
                offenders.append(f"{where}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in heading_anchors(
                    file.read_text(encoding="utf-8")):
                offenders.append(f"{where}: no heading #{anchor}")
    assert not offenders, "links in the docs that lead nowhere:\n" + "\n".join(offenders)


TEST_NAME = re.compile(r"`(tests/[\w/]+\.py)?::(\w+)`")


def named_tests(text: str) -> Iterator[tuple[int, str, str]]:
    """(line, file, test) for every `tests/x.py::test_y` in the text; a bare `::test_z` is in
    the file named last before it."""
    current = ""
    for found in TEST_NAME.finditer(text):
        current = found.group(1) or current
        yield line_of(text, found.start()), current, found.group(2)


def test_every_test_the_docs_name_exists() -> None:
    offenders = []
    for doc in documents():
        for line, file, name in named_tests((ROOT / doc).read_text(encoding="utf-8")):
            path = ROOT / file
            if not file or not path.is_file() or not re.search(
                    rf"^(?:async )?def {name}\(", path.read_text(), re.MULTILINE):
                offenders.append(f"{doc}:{line}: {file}::{name}")
    assert not offenders, "tests named in the docs that do not exist:\n" + "\n".join(offenders)


def test_the_path_finder_reads_the_docs_the_way_they_are_written() -> None:
    text = ("Run `scripts/test.sh`, see `bench/`, `infraops/{stats,traces}.py` and "
            "`<data>/repos/`,\n`/etc/shadow`, `templates/<app>/<page>.html`, `manage.py`, "
            "`agents/run.html#live-update`, `https://example.org/x.md`.\n"
            "```sh\nscripts/standalone.sh\n```\n`reviews/risk/`")
    assert list(backticked_paths(text)) == [
        (1, "scripts/test.sh"), (1, "bench/"), (1, "infraops/stats.py"),
        (1, "infraops/traces.py"), (6, "reviews/risk/"),
    ]
    assert heading_anchors("# The feedback contract\n## Case 1: numerics (`x`)\n") == {
        "the-feedback-contract", "case-1-numerics-x"}


NUMBER_WORDS = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def test_the_readme_counts_the_demo_goals_and_says_which_need_more_than_a_cpu() -> None:
    """It promised three demo goals; the dashboard showed six, two of which (the LLM agent's,
    the GPU's) cannot run without an LLM endpoint or a GPU worker."""
    import tomllib

    readme = " ".join((ROOT / "README.md").read_text().split())
    demo = tomllib.loads((ROOT / "examples" / "demo-kernels.goals.toml").read_text())["goal"]
    tiny = tomllib.loads((ROOT / "examples" / "tiny-serving.goals.toml").read_text())["goal"]

    assert f"The demo has {NUMBER_WORDS[len(demo)]} goals" in readme
    assert f"the dashboard lists {NUMBER_WORDS[len(demo) + len(tiny)]}" in readme
    assert sum(goal["policy"] == "tuner" and not goal["probe"].startswith("gpu-")
               for goal in demo) == 3
    assert "one per problem for the built-in tuner, which run on any machine" in readme
    assert "for the LLM agent, which needs an LLM endpoint" in readme
    assert "which needs a GPU worker" in readme
    assert "needs an LLM endpoint: none here" in readme


def test_the_readme_names_the_fix_the_tuners_numerics_run_submits() -> None:
    """It said tf32x3; the tuner keeps the precision that measured best, ieee
    (tests/e2e/test_showcase.py holds that)."""
    readme = " ".join((ROOT / "README.md").read_text().split())

    assert 'each run submits its case\'s fix (`INPUT_PRECISION = "ieee"`' in readme
