"""The built-in analysis of one changed file: which analyser reads it, and what a file with
nothing to read (a binary, a rename, a mode change) is.

Contract: ``analyse(change, moves)`` returns the file's built-in findings, each with an order
key (hunk, line within the hunk; whole-file findings first), at most one per rule and line.
Every file is either analysed or reported as one ``unclassified`` finding saying why not (a
binary, an unknown language). Code in a language no analyser reads (Rust, Go, ...) is read
for its comments only: a change to them alone is nothing, a change to its code is that one
finding, or production on each line of a launcher. Test code and documentation are analysed
to nothing by the analysers: they do not run in production (the families read a test's
tolerances and seeds).
"""

from __future__ import annotations

import re

from reviews.risk import files, production
from reviews.risk.code import (
    FOREIGN,
    NATIVE,
    PYTHON,
    PYTHON_TRITON,
    TRITON_FILE,
    MoveIndex,
    analyse_code,
    c_contexts_for,
    extend_match,
    python_contexts_for,
    python_extra,
)
from reviews.risk.diff import ADDED, CONTEXT, REMOVED, FileChange
from reviews.risk.families import family_findings
from reviews.risk.lexers import lex_c, lex_python
from reviews.risk.lines import Changed, Ordered, changed_lines, finding, line_finding, whole
from reviews.risk.round_ten import round_ten
from reviews.risk.signatures import (
    DEPLOY,
    LAUNCH,
    PRODUCTION,
    UNCLASSIFIED,
    UNREADABLE,
    Signature,
)
from reviews.risk.switches import switches

__all__ = ["MoveIndex", "Ordered", "analyse"]


def analyse(change: FileChange, moves: MoveIndex | None = None) -> list[Ordered]:
    """The built-in findings of one file (see the module docstring); ``moves``: the diff's
    changed lines, so that code moved from another file is not flagged again."""
    changed: set[tuple[int, int]] = set()
    found = _analysers(change, moves, changed)
    if change.binary or not change.hunks:
        return found
    language = files.language(change.path, _first_line(change))
    families = family_findings(change, language, found, moves, changed)
    kept = [(order, finding) for order, finding in found
            if not families.supersedes(order, finding)] + families.findings
    extra = switches(change, language) + round_ten(change, language)
    if not extra:
        return kept
    # A line the ninth or tenth round's families read is explained: no "unsure" reading of
    # it; in a foreign language (Go) a reading replaces the whole file's "unreadable".
    read = {order for order, _ in extra}
    foreign = language == files.FOREIGN
    return [(order, finding) for order, finding in kept
            if not (finding.category == UNCLASSIFIED and (
                order in read or (foreign and finding.line is None)))] + extra


def _analysers(change: FileChange, moves: MoveIndex | None,
               changed: set[tuple[int, int]]) -> list[Ordered]:
    """What the per-language analysers find; ``families`` adds what they miss. ``changed``
    gets the code lines whose tokens changed (not a rename, a re-wrap or an inlined
    temporary)."""
    path = change.path
    kind = files.deployment_kind(path) or (
        files.deployment_kind(change.old_path) if change.old_path != path else None) or (
        _kubernetes_content(change))
    if change.binary or any("\x00" in line.text for hunk in change.hunks for line in hunk.lines):
        found = [whole(change, UNCLASSIFIED, UNREADABLE, "binary file: the classifier cannot "
                       "read it")]
        if kind:
            found.append(whole(change, PRODUCTION, DEPLOY, f"changes {kind} (a binary)"))
        return [((-1, -1), finding) for finding in found]
    if not change.hunks:
        return _without_content(change, kind)
    if kind:
        return production.deployment(change, kind)
    language = files.language(path, _first_line(change))
    if files.is_test(path):
        # Test code and test data, in whatever language: they verify, not serve; but a test
        # script's install commands pin what CI verifies production with (seventh round).
        return production.install_pins(change) if language == files.SHELL else []
    if language is None:
        return [((-1, -1), whole(change, UNCLASSIFIED, UNREADABLE,
                                 files.describe_unknown(path)))]
    if language == files.DEPENDENCIES or (language == files.CONFIG_TOML
                                          and path.lower().endswith("cargo.toml")):
        pins = _dependency_pins(change, language == files.DEPENDENCIES)
        if language == files.DEPENDENCIES:
            return pins
        return sorted(pins + production.config(change, language), key=lambda pair: pair[0])
    if language in (files.DOCS, files.META):
        return []
    if language == files.FOREIGN:
        return _foreign(change)
    if language in (files.PYTHON, files.CYTHON):
        triton = any(TRITON_FILE.search(text) for hunk in change.hunks
                     for text in (hunk.section, *(line.text for line in hunk.lines)))
        return analyse_code(change, lex_python, python_contexts_for(triton),
                            PYTHON_TRITON if triton else PYTHON, python_extra, moves, changed)
    if language in (files.NATIVE, files.SHADER):
        device = language == files.SHADER
        cuda = path.endswith((".cu", ".cuh", ".hip"))
        return analyse_code(change, lex_c, c_contexts_for(device, cuda), NATIVE, None, moves,
                            changed)
    if language in files.CONFIG_LANGUAGES:
        return production.config(change, language)
    # Shell and build files: fast-math flags, launch commands and the recipes that launch.
    return production.shell(change)


def _without_content(change: FileChange, kind: str | None) -> list[Ordered]:
    """A rename, a mode change, an empty or deleted empty file: nothing to read but the
    paths and the modes."""
    if kind:
        what = {"renamed": f"renames {kind} (from {change.old_path})",
                "deleted": f"deletes {kind}", "added": f"adds {kind}"}.get(
            change.status, f"changes the file mode of {kind}")
        return [((-1, -1), whole(change, PRODUCTION, DEPLOY, what))]
    launcher = files.is_launch_script(change.path) and files.language(change.path) in (
        files.SHELL, files.PYTHON, files.FOREIGN, None)
    if change.mode_changed and launcher:
        return [((-1, -1), whole(change, PRODUCTION, LAUNCH,
                                  f"changes the file mode of a launch script "
                                  f"({change.old_mode} -> {change.new_mode})"))]
    return []


# A log or print statement of Rust, Go, Java or JS: its text is what changed.
_FOREIGN_LOG = re.compile(r"^\s*(?:(?:tracing::|log::)?(?:trace|debug|info|warn|error|println|"
                          r"eprintln|print|eprint)!\s*\(|(?:log|fmt|slog)\.\w+\(|"
                          r"console\.\w+\(|System\.(?:out|err)\.\w+\()")


def _foreign(change: FileChange) -> list[Ordered]:
    """Code in a language no analyser reads (Rust, Go, Zig, ...): a change to its comments
    or log text alone is harmless (the arguments of a log or error macro included); a change
    to its code (strings included: a default value is written in one) is read for the few
    things such code says plainly (``FOREIGN``: threads and tasks spawned, semaphores and
    channels, dtypes, a CLI flag's default); a run with such a finding is explained by it.
    A launcher's other code lines (its folder or name says it starts the service) are
    production each: the launcher's flags and defaults are how production starts. A file
    whose changed code nothing explains is one ``unclassified`` finding."""
    logged = _log_arguments(change)
    code = [item for item in changed_lines(change, lex_c, None, None)
            if item.lexed.has_code and not _FOREIGN_LOG.match(item.lexed.code)
            and item.order not in logged and not _prose_only(item)]
    if not code:
        return []
    hits = FOREIGN.first_matches([(item.lexed.code, item.lexed.raw, item.change.spans)
                                  for item in code], extend_match)
    out: list[Ordered] = []
    explained: set[tuple[int, int]] = set()  # (hunk, start of run)
    runs = {item.order: _run_start(item) for item in code}
    for item, found in zip(code, hits, strict=True):
        for signature, text in found.values():
            out.append((item.order, finding(change, item, signature, text)))
            explained.add(runs[item.order])
    if files.is_launcher(change.path):
        signature = Signature(LAUNCH, "", "changes the launcher's code (a language the "
                                          "classifier does not analyse): how production "
                                          "starts the service, its flags and defaults")
        out += [(item.order, finding(change, item, signature, "")) for item in code
                if runs[item.order] not in explained]
    if out:
        return sorted(out, key=lambda pair: pair[0])
    return [((-1, -1), whole(change, UNCLASSIFIED, UNREADABLE,
                             files.describe_unknown(change.path)))]


# Words in a string: a message a person reads ("failed to initialize backend: %v"), not a
# value a program reads ("bf16", "0.0.0.0", "--port").
_PROSE = re.compile(r"[A-Za-z]{2,}[,:;]?\s+[A-Za-z]{2,}")


def _prose_only(item: Changed) -> bool:
    """Whether the line's change lies only inside string literals that read as prose (tenth
    round: a typo fixed in an error message of Go code)."""
    if item.change.code or not item.change.spans:
        return False
    strings = item.lexed.strings
    raw = item.lexed.raw
    return all(any(start <= a and b <= end and _PROSE.search(raw[start:end])
                   for start, end in strings) for a, b in item.change.spans)


# A requirement of a manifest: `torch==2.4`, `git+https://...@<commit>#egg=x`, `require x v1`;
# in Cargo.toml a dependency's line (`cudarc = { version = "0.19.8", ... }`, `x = "1.2"`,
# `git = ...`, `rev = ...`), not the package's own name, version or edition.
_LOCK_FILE = re.compile(r"(?i)(?:\.lock|go\.sum|\.lock\.json)$")
# Tooling's requirements (a linter, docs, tests): they install nothing production runs.
_TOOLING_REQUIREMENTS = re.compile(r"(?i)(?:^|[/_.-])(?:dev|lint|docs?|tests?|testing|ci|"
                                   r"format|style|typing|mypy|bench)(?:[/_.-]|$)")
_CARGO_DEPENDENCY = re.compile(
    r"^\s*(?!(?:name|version|edition|authors|description|license|readme|repository|homepage|"
    r"documentation|keywords|categories|publish|resolver|members|exclude)\s*=)[\w-]+\s*=\s*"
    r"(?:\{|\"[~^=<>]*\d)|^\s*(?:git|rev|tag|branch)\s*=\s*\"")
_PIN_REASON = ("changes a dependency pin ({}): the code production installs and runs, its "
               "numerics and its threads")


def _dependency_pins(change: FileChange, manifest: bool) -> list[Ordered]:
    """Dependency pins (eighth round): a changed requirement of a requirements, constraints
    or Pipfile/go.mod manifest, or a dependency's line of a Cargo.toml, is production: two
    blind sets labelled such pins so (a git dependency pinned to a commit, a crate bumped).
    Lock files stay unread: they are generated from the manifests, which are read."""
    name = change.path.rsplit("/", 1)[-1]
    if manifest and (_LOCK_FILE.search(change.path) or _TOOLING_REQUIREMENTS.search(name)):
        return []
    out: list[Ordered] = []
    for h, hunk in enumerate(change.hunks):
        for i, line in enumerate(hunk.lines):
            text = line.text.strip()
            if line.kind == CONTEXT or not text or text.startswith(("#", "//", "[")):
                continue
            if manifest or _CARGO_DEPENDENCY.match(line.text):
                shown = text if len(text) <= 60 else text[:57] + "..."
                out.append(((h, i), line_finding(change, line, DEPLOY, PRODUCTION,
                                                 _PIN_REASON.format(shown))))
    return out


def _run_start(item: Changed) -> tuple[int, int]:
    """The (hunk, first line) of the run of changed lines ``item`` is in."""
    lines = item.hunk.lines
    i = item.order[1]
    while i > 0 and lines[i - 1].kind != CONTEXT:
        i -= 1
    return item.order[0], i


# A log, print or error macro or call that opens its arguments: `anyhow::bail!(`.
_FOREIGN_MESSAGE = re.compile(r"(?:\b(?:tracing::|log::|anyhow::)?(?:trace|debug|info|warn|error|"
                              r"println|eprintln|print|eprint|bail|panic|anyhow|format|"
                              r"unreachable|todo)!|\.(?:expect|context|with_context)|"
                              r"\b(?:log|fmt|slog)\.\w+|\bErrorf|\berrors\.New)\s*\(\s*$")


def log_arguments(texts: list[str]) -> set[int]:
    """The indices of ``texts`` (one side of a hunk, comments blanked) that are arguments of
    a log or error macro opened on a line of their own (``anyhow::bail!(`` then the message
    and its values, one a line): they change what is said, not what runs."""
    out: set[int] = set()
    depth = 0
    for i, code in enumerate(texts):
        if depth > 0:
            depth += code.count("(") - code.count(")")
            out.add(i)
            continue
        if _FOREIGN_MESSAGE.search(code):
            depth = 1
    return out


def _log_arguments(change: FileChange) -> set[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    for h, hunk in enumerate(change.hunks):
        for side in (ADDED, REMOVED):
            indices = [i for i, line in enumerate(hunk.lines) if line.kind in (CONTEXT, side)]
            lexed = lex_c([hunk.lines[i].text for i in indices])
            inside = log_arguments([item.code for item in lexed])
            out.update((h, indices[j]) for j in inside if hunk.lines[indices[j]].kind == side)
    return out


_K8S_LINE = re.compile(r"^\s*(?:apiVersion:\s*[\w./-]+\s*$|kind:\s*(?:Deployment|StatefulSet|"
                       r"DaemonSet|ReplicaSet|Pod|Job|CronJob|Service|Ingress|ConfigMap|"
                       r"HorizontalPodAutoscaler|InferenceService|ServingRuntime|"
                       r"LeaderWorkerSet|RayService|RayCluster)\s*$)")


def _kubernetes_content(change: FileChange) -> str | None:
    """Kubernetes manifests outside a k8s folder, known by their apiVersion and kind."""
    if files.language(change.path) != files.CONFIG_YAML or files.is_tooling(change.path):
        return None
    for hunk in change.hunks:
        if any(_K8S_LINE.match(line.text) for line in hunk.lines):
            return "Kubernetes manifests"
    return None


def _first_line(change: FileChange) -> str:
    for hunk in change.hunks:
        for line in hunk.lines:
            if (line.kind != REMOVED and line.new == 1) or (line.kind == REMOVED and line.old == 1):
                return line.text
    return ""
