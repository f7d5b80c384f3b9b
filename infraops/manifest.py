"""Read and validate a target repository's ``infraops.toml``: the feedback contract.

Contract:

- ``parse_manifest(text)`` returns a ``Manifest`` or raises ``ManifestError`` carrying *every*
  problem found, each with the table, the field and (best effort) the 1-based line it is
  written on. Nothing else escapes it, whatever the text (a property test holds it to that).
- The module is pure: no Django, no file system, no subprocess. Callers pass the text in.
- Tables are named in messages as ``probe[N] 'name'``, ``knob[N] 'name'`` (N counts the
  ``[[probe]]`` / ``[[knob]]`` tables from 1 in file order), ``risk.<name>`` and
  ``(top level)``.

The file format (see docs/feedback-contract.md; ``metrics``, ``files``, ``always`` and
``meta`` are our extensions)::

    [[probe]]
    name = "decode-bench"            # letters, digits, '.', '_', '-'
    layer = "performance"            # correctness | behaviour | performance | e2e
    command = "python bench/decode.py"
    metrics = ["tokens_per_s"]       # what it writes to metrics.jsonl (see below)
    # or tables: metrics = ["merge_us", {name = "rel_error", kind = "error", margin = 0.05}]
    cost = 2                         # whole number, lower runs first (default 1)
    timeout = 900                    # seconds (default 600)
    covers = ["src/kernels/**"]      # repo-relative globs (default ["**"])
    variants = {cp = ["off", "on"]}  # matrix; values become strings
    compare = {reference = {cp = "off"}, candidate = {cp = "on"}, rtol = 1e-5, atol = 1e-6}
    repeat = 5                       # default 1, or 5 for performance and e2e
    requires = ["gpu"]
    measure = "wall"                 # wall | instructions
    warmup = 1                       # executions a side before the samples (default 0)
    compile_cache = true             # keep what a side's first execution compiles (Triton's
                                     # kernels, torch's, CUDA's JIT) for its samples (default
                                     # false; docs/feedback-contract.md)
    extra_repeats = 10               # more repeats a side that may decide an inconclusive
                                     # comparison (default 2 x repeat for performance and e2e)
    plausible_speedup = 5            # a faster candidate fails as implausible (default 5)
    processes = 64                   # sandbox limits of one execution, within the operator's
    memory_mb = 2048                 # maxima (defaults: infraops.experiments.sandbox's):
    disk_mb = 1024                   # processes, total memory, what it writes (work tree + output)
    always = false                   # run even when covers misses the change
    files = ["bench/decode.py"]      # the probe's own files, protected from agent edits
    meta = {op_class = "decode", dtype = "fp32", head_dim = 128}  # what it exercises: facts
                                     # the skeleton library's conditions read (see META_*)

    # metrics: required (a non-empty array) for the behaviour, performance and e2e layers;
    # optional for layer = "correctness", whose verdict comes from outputs/ (default: none;
    # metrics = [] means none too). Checked once the layer itself is valid. Each is a name or
    # a table {name, kind, direction, unit, margin} (METRIC_KEYS); what a table leaves out
    # follows from the name (metric_defaults: "rel_error" is an error, "decode_us" a time).
    # compare: one table, as above, or an array of them for several rules:
    #   compare = [{reference = {cp = "off"}, candidate = {cp = "on"}}, {...}]
    # Both forms parse to the same tuple of Compare. Problems name the field compare.<key>
    # for the single table and compare[N].<key> for the N-th table of an array.

    [[knob]]
    name = "block-size"
    file = "src/config.py"
    pattern = '^BLOCK_SIZE = (\\d+)$'  # exactly one capturing group; compiled with re.MULTILINE
    range = [16, 256, 16]            # [low, high] or [low, high, step]; or values = [...]

    [risk.numerics]
    category = "numerics"            # numerics | concurrency | production
    reason = "kernels change numerical results"
    paths = ["src/kernels/**"]       # at least one of paths / patterns
    patterns = ['\\bfloat16\\b']
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import itertools
import math
import operator
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

LAYERS = ("correctness", "behaviour", "performance", "e2e")
MEASURES = ("wall", "instructions")
RISK_CATEGORIES = ("numerics", "concurrency", "production")
MANIFEST_PATH = "infraops.toml"

DEFAULT_COST = 1
DEFAULT_TIMEOUT = 600.0
DEFAULT_COVERS = ("**",)
# Wall time on this machine class varied 16-29% run to run: noisy layers need several samples.
NOISY_LAYERS = ("performance", "e2e")
DEFAULT_REPEAT_NOISY = 5
DEFAULT_REPEAT = 1
# The first execution of each side pays one-time costs (bytecode compilation in a fresh
# checkout, cold caches): +3.6% to +22% instructions measured. A whole warm-up execution a side
# doubled the cost of a cheap experiment; the samples themselves now show that bias (a first
# execution far worse than the rest is left out and replaced: feedback.stats.first_run_outlier),
# so warm-ups run only when a probe asks for them.
DEFAULT_WARMUP = 0
MAX_WARMUP = 10
# Extra repeats a side an inconclusive comparison may take, when the data say they would
# decide it (feedback.stats.sequential_compare): by default twice the planned repeats, for the
# layers that compare samples; at most MAX_EXTRA_REPEATS.
EXTRA_REPEATS_PER_REPEAT = 2
MAX_EXTRA_REPEATS = 100
# A speed-up beyond this factor fails as implausible unless the probe raises the bound.
DEFAULT_PLAUSIBLE_SPEEDUP = 5.0
# numpy.allclose's defaults, so that a compare entry without tolerances means what people expect.
DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-8
# knob_values refuses to list more than this: a tuner should use the range itself instead.
# Knob arithmetic is exact decimal; 28 digits (the default) would round long ranges silently.

# What a metric measures decides how a change of it is judged (infraops/feedback/findings.py):
# only time and throughput are performance, so only they make gains, regressions of speed and
# implausible speed-ups; an error falling 10^5-fold is a fix; counts (registers, spills) and
# ratios are facts of the run.
KINDS = ("time", "throughput", "error", "count", "memory", "ratio")
PERFORMANCE_KINDS = ("time", "throughput")
DIRECTIONS = ("minimize", "maximize")
METRIC_KEYS = ("name", "kind", "direction", "unit", "margin")
# Sample.unit's column.
MAX_UNIT = 40

TOP_LEVEL_KEYS = ("probe", "knob", "risk")
# Criteria belong to a goal, versioned with it (GoalVersion), not to the code under test.
CRITERIA_KEYS = ("criterion", "criteria", "acceptance")
GOAL_EDITOR_PATH = "/admin/infraops/goal/"
CRITERIA_ELSEWHERE = (
    "acceptance criteria do not live in infraops.toml: they belong to a goal and are versioned "
    f"with it; add them in the goal editor ({GOAL_EDITOR_PATH}, a goal's \"Acceptance "
    "criteria\"), naming a probe and metric declared here")
PROBE_KEYS = (
    "name", "layer", "command", "metrics", "cost", "timeout", "covers", "variants", "compare",
    "repeat", "requires", "measure", "always", "files", "higher_is_better", "warmup",
    "plausible_speedup", "processes", "memory_mb", "disk_mb", "meta", "extra_repeats",
    "compile_cache",
)
SANDBOX_LIMIT_KEYS = ("processes", "memory_mb", "disk_mb")
COMPARE_KEYS = ("reference", "candidate", "rtol", "atol")
KNOB_KEYS = ("name", "file", "pattern", "values", "range", "description", "skeleton")
# A skeleton's slug (skeletons.Skeleton.slug): lower-case words joined by hyphens.
_SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
RISK_KEYS = ("category", "reason", "paths", "patterns")

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# Variant keys become environment variables (upper-cased by the runner).
_VARIANT_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED_ENV_PREFIX = "INFRAOPS_"
# Requirements become parts of Celery queue names (experiments.gpu).
_REQUIREMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_REQUIREMENT_RULE = "letters, digits, '_' or '-', starting with a letter or digit"
_GLOB_CHARS = frozenset("*?[")

_NAME_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit"

# A probe's `meta`: free facts about what it exercises (op_class, dtype, shapes), read by the
# skeleton library's conditions (skeletons/applicability.py), whose field names follow the
# same rule. The probe's own fields are facts already: meta may not say them again.
META_KEY_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")
META_KEY_RULE = ("lower-case letters, digits and '_', starting with a letter, at most 40 "
                 "characters")
PROBE_FACTS = ("probe", "layer", "covers")
MAX_META_KEYS = 30
MAX_META_ITEMS = 50
MAX_META_TEXT = 200

# Column limits (characters) of the stored rows manifest values are copied into, checked at
# parse time so that a valid manifest never overflows a column in a worker. The module is pure,
# so these are constants; tests/infraops/test_manifest_limits.py holds them equal to the
# models' max_length.
# Probe names: ProbeExecution.probe, Sample.probe, Goal.probe, AcceptanceCriterion.probe.
MAX_PROBE_NAME = 100
# Metric names: Sample.metric, Goal.metric, AcceptanceCriterion.metric (and
# Experiment.margin_metric, "probe.metric", holds MAX_PROBE_NAME + 1 + MAX_METRIC_NAME).
MAX_METRIC_NAME = 100
# A variant cell as variant_key writes it, "k=v,k2=v2": ProbeExecution.variant, Sample.variant,
# AcceptanceCriterion.variant and reference_variant.
MAX_VARIANT_CELL = 200
# The queue an experiment is sent to, "experiments" + ".<requirement>" per distinct requirement
# of its probes (services.experiments.queue_for): Experiment.queue.
MAX_QUEUE_NAME = 100
QUEUE_PREFIX = "experiments"


# --- Parsed data ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ManifestProblem:
    """One thing wrong with the manifest, located as precisely as the text allows."""

    table: str
    field: str | None
    line: int | None
    message: str

    def __str__(self) -> str:
        where = [f"line {self.line}"] if self.line is not None else []
        where.append(self.table)
        if self.field is not None:
            where.append(f"field {self.field}")
        return f"{', '.join(where)}: {self.message}"


class ManifestError(Exception):
    """The manifest is invalid. ``problems`` holds all problems found, in file order."""

    def __init__(self, problems: Sequence[ManifestProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))

    def __reduce__(self) -> tuple[type[ManifestError], tuple[list[ManifestProblem]]]:
        # Exception pickles as cls(*args) with args = (message,); rebuild from the problems.
        return (type(self), (self.problems,))


@dataclasses.dataclass(frozen=True)
class Compare:
    """Outputs of the ``reference`` variant cell must match the ``candidate`` cell within
    ``|candidate - reference| <= atol + rtol * |reference|``. Both name the same variant keys;
    the values are strings as in ``Probe.variants``."""

    reference: dict[str, str]
    candidate: dict[str, str]
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL


@dataclasses.dataclass(frozen=True)
class Metric:
    """What one metric measures: its kind (KINDS), which way is better, its unit ("" when the
    samples carry their own), and its "no change" margin (a share: 0.02 means any effect
    within +-2% is no change; None keeps the goal's or the default +-1%)."""

    name: str
    kind: str
    direction: str
    unit: str = ""
    margin: float | None = None

    @property
    def performance(self) -> bool:
        """Whether a change of it is a change of speed: a gain, or a regression of speed."""
        return self.kind in PERFORMANCE_KINDS


# Name -> kind, first match wins (so "err_ratio" is an error and "tokens_per_s" a throughput
# before its "_s" makes it a time). Words are separated by '_', '.' or '-'.
_WORD = r"(?:^|[_.-])"
_END = r"(?:$|[_.-])"
_KIND_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern)) for kind, pattern in (
        ("error", rf"{_WORD}(?:err|errs|error|errors|mismatch(?:es)?|ulps?|drift){_END}"),
        ("throughput", rf"per_s(?:ec)?{_END}|{_WORD}(?:throughput|bandwidth|qps|rps|tps|"
                       rf"[gtm]?flops|[gmk]bps|gb_s|tokens_s|ops_s){_END}"),
        ("memory", rf"{_WORD}(?:bytes|kb|mb|gb|kib|mib|gib|memory|mem|rss|vram|heap){_END}"),
        ("time", rf"{_WORD}(?:ns|us|ms|s|sec|secs|seconds|latency|time|duration|wall|p50|p90|"
                 rf"p95|p99|cycles|instructions){_END}"),
        ("count", rf"{_WORD}(?:count|num|n|registers|regs|spills|programs|warps|calls|launches|"
                  rf"passed|failed|retries|steps){_END}"),
        ("ratio", rf"{_WORD}(?:ratio|retention|fraction|share|rate|percent|pct|speedup|"
                  rf"occupancy|utilization|efficiency){_END}"),
    ))
_TIME_UNIT = re.compile(rf"{_WORD}(ns|us|ms|s){_END}")
_MEMORY_UNIT = re.compile(rf"{_WORD}(bytes|kb|mb|gb|kib|mib|gib){_END}")
# A name nothing matches is a time: what every metric meant before kinds (a cost to lower).
DEFAULT_KIND = "time"


def metric_defaults(name: str) -> Metric:
    """The kind, direction and unit a metric named `name` has when the manifest does not say:
    see docs/feedback-contract.md, "Metric kinds". Throughput is better higher, the rest
    lower; the unit is a unit word of the name ("decode_us_b1": us), "/s" for a throughput."""
    lowered = name.lower()
    kind = next((kind for kind, pattern in _KIND_PATTERNS if pattern.search(lowered)),
                DEFAULT_KIND)
    unit = "/s" if kind == "throughput" else ""
    if kind == "time":
        found = _TIME_UNIT.search(lowered)
        unit = found.group(1) if found else "instructions" if lowered == "instructions" else ""
    elif kind == "memory":
        found = _MEMORY_UNIT.search(lowered)
        unit = {"bytes": "B"}.get(found.group(1), found.group(1).upper()) if found else ""
    return Metric(name, kind, "maximize" if kind == "throughput" else "minimize", unit)


MetaScalar = str | int | float | bool
MetaValue = MetaScalar | tuple[str | int | float, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Probe:
    """One ``[[probe]]``. ``repeat`` has no dataclass default because the parser's default
    depends on the layer. The parser leaves ``metrics`` empty only for a correctness probe that
    lists none and does not measure instructions. Not hashable (``variants`` is a dict)."""

    name: str
    layer: str
    command: str
    metrics: tuple[str, ...] = ()
    repeat: int
    cost: int = DEFAULT_COST
    timeout: float = DEFAULT_TIMEOUT
    covers: tuple[str, ...] = DEFAULT_COVERS
    variants: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    compare: tuple[Compare, ...] = ()
    requires: tuple[str, ...] = ()
    measure: str = "wall"
    always: bool = False
    files: tuple[str, ...] = ()
    higher_is_better: tuple[str, ...] = ()
    warmup: int = DEFAULT_WARMUP
    compile_cache: bool = False
    extra_repeats: int = 0  # the parser's default depends on the layer and repeat
    plausible_speedup: float = DEFAULT_PLAUSIBLE_SPEEDUP
    processes: int | None = None  # None: the sandbox's default
    memory_mb: int | None = None
    disk_mb: int | None = None
    meta: dict[str, MetaValue] = dataclasses.field(default_factory=dict)
    # The metrics written as tables, and those listed in higher_is_better: see metric().
    declared: tuple[Metric, ...] = ()

    def metric(self, name: str) -> Metric:
        """What `name` measures: as the manifest declares it, else as its name says
        (metric_defaults); higher_is_better makes it 'maximize'. A metric the probe writes
        without listing it is judged by its name too."""
        found = next((m for m in self.declared if m.name == name), None) or metric_defaults(name)
        if name in self.higher_is_better and found.direction != "maximize":
            found = dataclasses.replace(found, direction="maximize")
        return found

    def direction(self, metric: str) -> str:
        """'maximize' or 'minimize': see metric()."""
        return self.metric(metric).direction

    def variant_matrix(self) -> list[dict[str, str]]:
        """Every combination of variant values, keys in manifest order; ``[{}]`` when the
        probe has no variants (it then runs once per repeat, with no variant variables)."""
        keys = list(self.variants)
        return [
            dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(self.variants[key] for key in keys))
        ]

    def covers_any(self, paths: Iterable[str]) -> bool:
        """Whether any of the repo-relative ``paths`` matches one of ``covers`` (see
        ``glob_match``). ``always`` is not consulted: the scheduler combines the two."""
        wanted = list(paths)
        return any(glob_match(glob, path) for glob in self.covers for path in wanted)


@dataclasses.dataclass(frozen=True)
class Knob:
    """A tunable value in ``file``: ``pattern`` (re.MULTILINE) has exactly one capturing
    group, the value. Exactly one of ``values`` and ``range`` is set; ``range`` is
    ``(low, high, step)`` with ``step`` None for a continuous range. Range bounds keep the
    type TOML gave them: all-int bounds make a whole-number knob."""

    name: str
    file: str
    pattern: str
    values: tuple[str, ...] | None = None
    range: tuple[float, float, float | None] | None = None
    description: str = ""
    skeleton: str = ""  # the slug of the library's technique that turning this knob applies


@dataclasses.dataclass(frozen=True)
class RiskRule:
    """A ``[risk.<name>]`` rule for the risk classifier: changed files matching ``paths``
    and/or changed lines matching ``patterns`` are a ``category`` risk, for ``reason``.
    At least one of ``paths`` and ``patterns`` is non-empty."""

    name: str
    category: str
    reason: str
    paths: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A valid manifest. Probe and knob names are unique."""

    probes: tuple[Probe, ...]
    knobs: tuple[Knob, ...] = ()
    risk: tuple[RiskRule, ...] = ()

    def probe(self, name: str) -> Probe | None:
        return next((probe for probe in self.probes if probe.name == name), None)

    def knob(self, name: str) -> Knob | None:
        return next((knob for knob in self.knobs if knob.name == name), None)

    def metrics(self) -> dict[str, tuple[str, ...]]:
        """Probe name -> the metric names it reports, in manifest order."""
        return {probe.name: probe.metrics for probe in self.probes}

    def protected_paths(self) -> tuple[str, ...]:
        """``infraops.toml`` and every probe's ``files`` (paths or globs, see ``glob_match``),
        without duplicates: what the agent may never edit, whatever its boundaries say."""
        paths = [MANIFEST_PATH, *(path for probe in self.probes for path in probe.files)]
        return tuple(dict.fromkeys(paths))


# --- Globs ---------------------------------------------------------------------------------


def glob_match(pattern: str, path: str) -> bool:
    """Whether the repo-relative POSIX ``path`` matches ``pattern`` as a whole.

    Segments are split on '/'; a ``**`` segment matches any number of segments (zero
    included); any other segment matches one path segment with fnmatch rules, case-sensitive
    (``*``, ``?``, ``[...]``). The match is anchored at the repository root, so ``*.py`` matches
    only top-level files and ``**/*.py`` matches them at any depth. A pattern ending in '/'
    matches everything below that folder. Absolute paths never match.
    """
    if path.startswith("/"):
        return False
    wanted = [segment for segment in path.split("/") if segment not in ("", ".")]
    segments = pattern.split("/")
    if pattern.endswith("/"):
        segments[-1] = "**"
    # reach[j]: the segments seen so far match the first j path segments.
    reach = [True] + [False] * len(wanted)
    for segment in segments:
        if segment == "**":
            reach = list(itertools.accumulate(reach, operator.or_))
        else:
            reach = [False] + [
                reach[j] and fnmatch.fnmatchcase(wanted[j], segment) for j in range(len(wanted))
            ]
    return reach[-1]


def _relative_path_problem(path: str, *, glob: bool) -> str | None:
    """Why ``path`` cannot name something inside the repository; None when it can."""
    if not path.strip():
        return "is empty"
    if path.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", path):
        return "is absolute; write it relative to the repository root"
    segments = path.split("/")
    if glob and path.endswith("/"):
        segments = segments[:-1]
    if ".." in segments:
        return "contains '..'; it must stay inside the repository"
    if "." in segments:
        return "contains a '.' segment; write 'src/x', not './src/x'"
    if "" in segments:
        return "has an empty path segment ('//' or a trailing '/')"
    if not glob and _GLOB_CHARS & set(path):
        return "must name one file, without glob characters"
    return None


# --- Locating tables and fields in the text ------------------------------------------------

_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_KEY_PART_RE = re.compile(_KEY_PART)
_HEADER_RE = re.compile(
    rf"\s*(\[\[?)\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*(\]\]?)\s*(?:#.*)?"
)


@dataclasses.dataclass(frozen=True)
class _Header:
    line: int
    parts: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class _Span:
    """A table's text: its header line (None for the root) up to ``end`` (exclusive)."""

    parts: tuple[str, ...]
    header: int | None
    end: int


def _key_parts(dotted: str) -> tuple[str, ...]:
    return tuple(part.strip("\"'") for part in _KEY_PART_RE.findall(dotted))


def _code_mask(lines: Sequence[str]) -> list[bool]:
    """Per line: False when it starts inside a multi-line string (so it holds no key)."""
    mask: list[bool] = []
    inside: str | None = None
    for line in lines:
        mask.append(inside is None)
        position = 0
        while True:
            if inside is None:
                found = [(line.find(q, position), q) for q in ('"""', "'''")]
                found = [(at, q) for at, q in found if at >= 0]
                if not found:
                    break
                position, inside = min(found)
            else:
                position = line.find(inside, position)
                if position < 0:
                    break
                inside = None
            position += 3
    return mask


class _Locator:
    """Best-effort map from tables and keys to 1-based lines; TOML parsing stays tomllib's.

    It reads headers (``[a.b]``, ``[[a]]``) and ``key =`` / ``key.sub =`` lines, skipping lines
    inside multi-line strings. It never raises, and answers None when it cannot tell.
    """

    def __init__(self, text: str) -> None:
        self._lines = text.splitlines()
        self._code = _code_mask(self._lines)
        self._headers: list[_Header] = []
        for number, line in enumerate(self._lines, start=1):
            match = _HEADER_RE.fullmatch(line) if self._code[number - 1] else None
            if match and len(match.group(1)) == len(match.group(3)):
                self._headers.append(_Header(number, _key_parts(match.group(2))))

    def root(self) -> _Span:
        return _Span((), None, len(self._lines) + 1)

    def table(self, parts: tuple[str, ...], occurrence: int = 1) -> _Span | None:
        """The ``occurrence``-th (1-based) table written with header ``parts``."""
        found = [h for h in self._headers if h.parts == parts]
        if len(found) < occurrence:
            return None
        header = found[occurrence - 1]
        end = next(
            (h.line for h in self._headers if h.line > header.line and not _below(parts, h.parts)),
            len(self._lines) + 1,
        )
        return _Span(parts, header.line, end)

    def key_line(self, span: _Span, key: str) -> int | None:
        """Where ``key`` is set directly in the span, or its sub-table header."""
        start = (span.header or 0) + 1
        subs = [
            h for h in self._headers if start <= h.line < span.end and _below(span.parts, h.parts)
        ]
        direct_end = subs[0].line if subs else span.end
        pattern = re.compile(rf"\s*{_key_alternatives(key)}\s*[=.]")
        for number in range(start, direct_end):
            if self._code[number - 1] and pattern.match(self._lines[number - 1]):
                return number
        return next((h.line for h in subs if h.parts[len(span.parts)] == key), None)

    def token_line(self, start: int, end: int, key: str, occurrence: int = 1) -> int | None:
        """The line of the ``occurrence``-th ``key =`` from line ``start`` up to ``end``: how
        keys inside inline tables (``{rtol = 1e-5}``) and sub-tables are found."""
        pattern = re.compile(rf"(?:^|[\s{{,.])(?:{_key_alternatives(key)})\s*=")
        seen = 0
        for number in range(start, min(end, len(self._lines) + 1)):
            if not self._code[number - 1]:
                continue
            seen += len(pattern.findall(self._lines[number - 1]))
            if seen >= occurrence:
                return number
        return None


def _below(parts: tuple[str, ...], other: tuple[str, ...]) -> bool:
    return len(other) > len(parts) and other[: len(parts)] == parts


def _key_alternatives(key: str) -> str:
    bare = re.escape(key)
    return rf"(?:{bare}|\"{bare}\"|'{bare}')"


class _Table:
    """Problems of one table, each given the best line the locator finds."""

    def __init__(
        self, *, label: str, locator: _Locator, span: _Span | None, header: int | None,
        problems: list[ManifestProblem],
    ) -> None:
        self.label = label
        self._locator = locator
        self._span = span
        self._header = header
        self.problems = problems

    def line_of(self, key: str | None) -> int | None:
        """The line setting ``key`` in this table; the table's header line when not found."""
        if key is None or self._span is None:
            return self._header
        found = self._locator.key_line(self._span, key)
        return self._header if found is None else found

    def line_within(self, key: str, inner: str, occurrence: int = 1) -> int | None:
        """The line of the ``occurrence``-th ``inner =`` at or after ``key``'s line."""
        start = self.line_of(key)
        if start is None or self._span is None:
            return start
        found = self._locator.token_line(start, self._span.end, inner, occurrence)
        return start if found is None else found

    def report(self, field: str | None, message: str, *, line: int | None = None) -> None:
        where = line if line is not None else self.line_of(field)
        self.problems.append(ManifestProblem(self.label, field, where, message))

    def count(self) -> int:
        return len(self.problems)


# --- Parsing -------------------------------------------------------------------------------


def parse_manifest(text: str) -> Manifest:
    """Parse and validate an ``infraops.toml``; raise ManifestError listing every problem.

    A TOML syntax error is one problem carrying tomllib's line and message. Validation goes
    on past the first problem so that one refresh shows the author everything to fix.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError([_syntax_problem(exc, text)]) from None
    except (ValueError, RecursionError) as exc:
        # tomllib lets int()'s digit limit and deep nesting through as themselves.
        problem = ManifestProblem("(top level)", None, None, f"cannot read this TOML: {exc}")
        raise ManifestError([problem]) from None
    locator = _Locator(text)
    problems: list[ManifestProblem] = []
    root = _Table(
        label="(top level)", locator=locator, span=locator.root(), header=None,
        problems=problems,
    )
    for key in data:
        if key in CRITERIA_KEYS:
            root.report(key, CRITERIA_ELSEWHERE)
        elif key not in TOP_LEVEL_KEYS:
            root.report(key, _unknown_key("top-level key", key, TOP_LEVEL_KEYS))
    probes = _parse_probes(data.get("probe"), root, locator)
    knobs = _parse_knobs(data.get("knob"), root, locator)
    risk = _parse_risk(data.get("risk"), root, locator)
    if problems:
        ordered = sorted(problems, key=lambda p: (p.line is None, p.line or 0))
        raise ManifestError(ordered)
    return Manifest(probes=probes, knobs=knobs, risk=risk)


def _syntax_problem(exc: tomllib.TOMLDecodeError, text: str) -> ManifestProblem:
    message = str(exc)
    line: int | None = None
    located = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", message, re.DOTALL)
    if located:
        message = f"{located.group(1)} (column {located.group(3)})"
        line = int(located.group(2))
    elif message.endswith(" (at end of document)"):
        message = message.removesuffix(" (at end of document)") + " (at the end of the file)"
        line = max(1, len(text.splitlines()))
    return ManifestProblem("(top level)", None, line, f"TOML syntax error: {message}")


def _table_for(
    root: _Table, locator: _Locator, parts: tuple[str, ...], label: str, occurrence: int = 1,
) -> _Table:
    span = locator.table(parts, occurrence)
    header = span.header if span is not None else None
    if span is None:
        # Written inline (probe = [{...}] or [risk] with name = {...}): point at the key.
        parent = locator.table(parts[:-1]) if len(parts) > 1 else None
        if parent is not None:
            header = locator.key_line(parent, parts[-1])
        if header is None:
            header = root.line_of(parts[0])
    return _Table(
        label=label, locator=locator, span=span, header=header, problems=root.problems,
    )


def _array_of_tables(
    raw: object, key: str, root: _Table, example: str,
) -> list[tuple[int, dict[str, Any]]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        root.report(key, f"{key} must be an array of tables: write each one as [[{key}]]{example}")
        return []
    return list(enumerate(raw, start=1))


def _parse_probes(raw: object, root: _Table, locator: _Locator) -> tuple[Probe, ...]:
    if raw is None or raw == []:
        root.report("probe", "there is no [[probe]] table; the agent needs at least one probe")
        return ()
    probes: list[Probe] = []
    first_seen: dict[str, tuple[str, int | None]] = {}
    requirements: set[str] = set()
    for index, table in _array_of_tables(raw, "probe", root, ""):
        name = table.get("name")
        label = f"probe[{index}] {name!r}" if isinstance(name, str) and name else f"probe[{index}]"
        report = _table_for(root, locator, ("probe",), label, index)
        probe = _parse_probe(table, report)
        if probe is not None and not requirements.issuperset(probe.requires):
            before = _queue_length(requirements)
            requirements.update(probe.requires)
            if _queue_length(requirements) > MAX_QUEUE_NAME >= before:
                report.report(
                    "requires",
                    f"the requirements of the probes up to this one make the queue name "
                    f"{_clip(_queue_name(requirements))} {_queue_length(requirements)} "
                    f"characters, over the {MAX_QUEUE_NAME} it is stored in (Experiment.queue: "
                    f"{QUEUE_PREFIX!r} and '.<requirement>' for each distinct requirement); use "
                    "shorter or fewer requirements",
                )
        if isinstance(name, str) and name:
            if name in first_seen:
                other, other_line = first_seen[name]
                where = f" on line {other_line}" if other_line is not None else ""
                report.report("name", f"duplicate probe name {name!r}: {other}{where} has it too")
                continue
            first_seen[name] = (label, report.line_of("name"))
        if probe is not None:
            probes.append(probe)
    return tuple(probes)


def _queue_name(requirements: Iterable[str]) -> str:
    """As services.experiments.queue_for names it."""
    return QUEUE_PREFIX + "".join(f".{req}" for req in sorted(set(requirements)))


def _queue_length(requirements: Iterable[str]) -> int:
    return len(_queue_name(requirements))


def _parse_probe(raw: Mapping[str, Any], report: _Table) -> Probe | None:
    before = report.count()
    _check_keys(raw, PROBE_KEYS, report, "probe key")
    name = _name(raw, "name", report, limit=(MAX_PROBE_NAME, "probe names"))
    layer = _choice(raw, "layer", LAYERS, report, default=None)
    command = _text(raw, "command", report, required=True)
    metrics, declared = _metrics(raw, layer, report)
    cost = _whole(raw, "cost", report, default=DEFAULT_COST, positive=False)
    timeout = _seconds(raw, "timeout", report)
    covers = _globs(raw, "covers", report, default=DEFAULT_COVERS)
    variants = _variants(raw, report)
    compare = _compares(raw, variants, report)
    noisy = layer in NOISY_LAYERS
    repeat = _whole(
        raw, "repeat", report, default=DEFAULT_REPEAT_NOISY if noisy else DEFAULT_REPEAT,
        positive=True,
    )
    requires = _strings(
        raw, "requires", report, what="requirement", shape=(_REQUIREMENT_RE, _REQUIREMENT_RULE),
    )
    measure = _choice(raw, "measure", MEASURES, report, default="wall")
    warmup = _whole(raw, "warmup", report, default=DEFAULT_WARMUP, positive=False)
    if not 0 <= warmup <= MAX_WARMUP:
        report.report("warmup", f"warmup must be a whole number from 0 to {MAX_WARMUP}, "
                                f"got {warmup}")
    extra_repeats = _whole(raw, "extra_repeats", report, positive=False,
                           default=min(EXTRA_REPEATS_PER_REPEAT * repeat, MAX_EXTRA_REPEATS)
                           if noisy else 0)
    if not 0 <= extra_repeats <= MAX_EXTRA_REPEATS:
        report.report("extra_repeats", "extra_repeats must be a whole number from 0 to "
                                       f"{MAX_EXTRA_REPEATS}, got {extra_repeats}")
    if noisy and _never_decides(repeat, extra_repeats):
        least = next(n for n in itertools.count(repeat) if not _never_decides(n, extra_repeats))
        report.report("repeat", f"repeat = {repeat} with extra_repeats = {extra_repeats} can "
                      "never call a change improved or regressed: with complete separation "
                      "the exact rank test cannot reach its level (p < 0.01 over all looks) "
                      f"at {repeat + extra_repeats} executions a side. Set repeat = {least} "
                      "or more, give extra_repeats room, or repeat = 1 or 2 for a single "
                      "measurement that compares nothing")
    speedup = raw.get("plausible_speedup", DEFAULT_PLAUSIBLE_SPEEDUP)
    if not _is_number(speedup) or not math.isfinite(speedup) or speedup <= 1:
        report.report("plausible_speedup", "plausible_speedup must be a number above 1 (a "
                      f"factor: 5 means 5x faster), got {_show(speedup)}")
        speedup = DEFAULT_PLAUSIBLE_SPEEDUP
    always = _flag(raw, "always", report)
    compile_cache = _flag(raw, "compile_cache", report)
    limits = {key: _whole(raw, key, report, default=1, positive=True) if key in raw else None
              for key in SANDBOX_LIMIT_KEYS}  # maxima are the host's: checked when it runs
    files = _globs(raw, "files", report, default=())
    meta = _meta(raw, report)
    higher = _strings(raw, "higher_is_better", report, what="metric name")
    for metric in higher:
        if metric not in metrics:
            listed = f"({', '.join(metrics)})" if metrics else "(it lists none)"
            report.report("higher_is_better",
                          f"{metric!r} is not one of this probe's metrics {listed}")
    if raw.get("covers") == [] and not always:
        report.report(
            "covers",
            "covers is empty, so the probe would never be chosen: list globs, leave covers out "
            "(it defaults to [\"**\"]) or set always = true",
        )
    if (
        report.count() > before or name is None or layer is None or command is None
        or variants is None or compare is None
    ):
        return None
    if measure == "instructions" and "instructions" not in metrics:
        metrics = (*metrics, "instructions")  # counted by the runner under callgrind
    return Probe(
        name=name, layer=layer, command=command, metrics=metrics, repeat=repeat, cost=cost,
        timeout=timeout, covers=covers, variants=variants, compare=compare, requires=requires,
        measure=measure or "wall", always=always, files=files, higher_is_better=higher,
        warmup=warmup, compile_cache=compile_cache, extra_repeats=extra_repeats,
        plausible_speedup=float(speedup), meta=meta, declared=declared,
        **limits,
    )


def _never_decides(repeat: int, extra_repeats: int) -> bool:
    """A plan that compares (at least MIN_SAMPLES a side) but can never decide at any look."""
    from infraops.feedback import stats

    return repeat >= stats.MIN_SAMPLES and not stats.plan_can_decide(repeat, extra_repeats)


def _meta(raw: Mapping[str, Any], report: _Table) -> dict[str, MetaValue]:
    """The probe's free facts: a table of at most MAX_META_KEYS keys (META_KEY_RULE, none of
    PROBE_FACTS), each a string, number, boolean or a non-empty array of strings or numbers
    (a shape the probe covers, e.g. seq_len = [1024, 65536]). {} when it has problems."""
    table = raw.get("meta", {})
    example = 'e.g. meta = {op_class = "merge", dtype = "fp32", seq_len = [1024, 65536]}'
    if not isinstance(table, dict):
        report.report("meta", f"meta must be a table of facts, {example}; got {_show(table)}")
        return {}
    before = report.count()
    if len(table) > MAX_META_KEYS:
        report.report("meta", f"meta has {len(table)} keys; at most {MAX_META_KEYS}")
    meta: dict[str, MetaValue] = {}
    for key, value in table.items():
        field = f"meta.{key}"
        line = report.line_within("meta", key)
        if not META_KEY_RE.fullmatch(key):
            report.report(field, f"meta key {_clip(key)} must be {META_KEY_RULE}", line=line)
        elif key in PROBE_FACTS:
            report.report(field, f"meta.{key} repeats the probe's own {key}: conditions read "
                                 "that field itself", line=line)
        problem = _meta_value_problem(value)
        if problem is not None:
            report.report(field, f"{field} {problem}, {example}", line=line)
            continue
        meta[key] = tuple(value) if isinstance(value, list) else value
    return meta if report.count() == before else {}


def _meta_value_problem(value: object) -> str | None:
    """Why a meta value is not a string, finite number, boolean or a short non-empty array of
    strings or numbers; None when it is one."""
    if isinstance(value, list):
        if not value or len(value) > MAX_META_ITEMS:
            return f"must list from 1 to {MAX_META_ITEMS} values, got {len(value)}"
        if not all(isinstance(item, str) or _is_number(item) for item in value):
            return "must list strings or numbers only"
        return next(filter(None, (_meta_value_problem(item) for item in value)), None)
    if isinstance(value, str):
        if not value.strip() or len(value) > MAX_META_TEXT:
            return f"must be a non-empty text of at most {MAX_META_TEXT} characters"
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return None if math.isfinite(value) else "must be a finite number"
    return f"must be a string, number, boolean or array, got {_show(value)}"


def _metrics(raw: Mapping[str, Any], layer: str | None, report: _Table
             ) -> tuple[tuple[str, ...], tuple[Metric, ...]]:
    """The metric names, and the metrics written as tables; names required (non-empty) unless
    the layer is correctness. An invalid or missing layer is reported on its own, so whether
    metrics are required is left unjudged."""
    value = raw.get("metrics")
    declared: list[Metric] = []
    if isinstance(value, list) and any(isinstance(item, dict) for item in value):
        names: list[str] = []
        tables = 0
        for index, item in enumerate(value, start=1):
            if isinstance(item, dict):
                tables += 1
                line = report.line_within("metrics", "name", tables)
                table = _metric_table(item, f"metrics[{index}]", report, line)
                if table is None:
                    continue  # reported
                declared.append(table)
                item = table.name
            names.append(item)
        metrics = _strings({"metrics": names}, "metrics", report, what="metric name")
    else:
        metrics = _strings(raw, "metrics", report, what="metric name")
    for metric in metrics:
        _fits(metric, MAX_METRIC_NAME, "metric names", "metrics", report, what="metric name")
    if layer is None or layer == "correctness" or metrics:
        return metrics, tuple(declared)
    optional = "(only correctness probes may leave it out)"
    if value is None:
        report.report(
            "metrics",
            f"metrics is required for a {layer} probe: a non-empty array of the metric names "
            f"it writes to metrics.jsonl, e.g. metrics = [\"tokens_per_s\"] {optional}",
        )
    elif isinstance(value, list) and not value:
        report.report(
            "metrics", f"metrics must list at least one metric name for a {layer} probe "
                       f"{optional}",
        )
    return metrics, tuple(declared)


def _metric_table(raw: Mapping[str, Any], field: str, report: _Table, line: int | None
                  ) -> Metric | None:
    """One metric written as a table, e.g. {name = "rel_error", kind = "error"}; what it
    leaves out follows from its name (metric_defaults)."""
    before = report.count()
    for key in raw:
        if key not in METRIC_KEYS:
            report.report(f"{field}.{key}", _unknown_key("metric key", key, METRIC_KEYS),
                          line=line)
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        report.report(f"{field}.name", "a metric table needs a name, e.g. {name = "
                      "\"rel_error\", kind = \"error\"}"
                      + (f"; got {_show(name)}" if name is not None else ""), line=line)
        return None
    defaults = metric_defaults(name)
    kind = _metric_choice(raw, "kind", KINDS, defaults.kind, field, report, line)
    # A table that names a kind and no direction takes the kind's direction.
    default_direction = "maximize" if kind == "throughput" else "minimize"
    direction = _metric_choice(raw, "direction", DIRECTIONS, default_direction, field, report,
                               line)
    unit = raw.get("unit", defaults.unit if kind == defaults.kind else "")
    if not isinstance(unit, str) or len(unit) > MAX_UNIT:
        report.report(f"{field}.unit", f"unit must be a text of at most {MAX_UNIT} characters "
                      f"(it is stored with each sample), got {_clip(str(unit))}", line=line)
    margin = raw.get("margin")
    if margin is not None and not (_is_number(margin) and 0 < margin < 1):
        report.report(f"{field}.margin", "margin is the share within which a change is \"no "
                      f"change\": a number between 0 and 1 (0.02 means +-2%), got "
                      f"{_show(margin)}", line=line)
    if report.count() > before:
        return None
    return Metric(name, kind, direction, str(unit),
                  float(margin) if margin is not None else None)


def _metric_choice(raw: Mapping[str, Any], key: str, allowed: Sequence[str], default: str,
                   field: str, report: _Table, line: int | None) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or value not in allowed:
        hint = _did_you_mean(value, allowed) if isinstance(value, str) else ""
        report.report(f"{field}.{key}", f"{key} must be one of {', '.join(allowed)}; got "
                      f"{_show(value)}{hint}", line=line)
        return default
    return value


def _variants(raw: Mapping[str, Any], report: _Table) -> dict[str, tuple[str, ...]] | None:
    """The variant matrix with values as strings; None when it has problems."""
    table = raw.get("variants", {})
    if not isinstance(table, dict):
        report.report(
            "variants",
            f"variants must be a table of arrays, e.g. variants = {{cp = [\"off\", \"on\"]}}; "
            f"got {_show(table)}",
        )
        return None
    before = report.count()
    variants: dict[str, tuple[str, ...]] = {}
    env_names: dict[str, str] = {}
    for key, values in table.items():
        field = f"variants.{key}"
        line = report.line_within("variants", key)
        if not _VARIANT_KEY_RE.fullmatch(key) or key.upper().startswith(_RESERVED_ENV_PREFIX):
            report.report(
                field,
                f"variant key {key!r} must be usable as an environment variable name (letters, "
                f"digits and '_', not starting with a digit or {_RESERVED_ENV_PREFIX})",
                line=line,
            )
        elif key.upper() in env_names:
            report.report(
                field,
                f"variant keys {env_names[key.upper()]!r} and {key!r} give the same environment "
                f"variable {key.upper()}",
                line=line,
            )
        env_names.setdefault(key.upper(), key)
        strings = _scalar_list(values, field, report, line=line, what="variant value")
        if strings is not None:
            variants[key] = strings
    if report.count() == before:
        _variant_cells_fit(variants, report)
    return variants if report.count() == before else None


def _variant_cells_fit(variants: dict[str, tuple[str, ...]], report: _Table) -> None:
    """Every cell of the matrix, written as variant_key does ('k=v,k2=v2'), fits the
    MAX_VARIANT_CELL-character columns it is stored in. A value too long on its own is named
    on its key's line; otherwise the longest cell is named."""
    if not variants:
        return
    before = report.count()
    for key, values in variants.items():
        for value in values:
            if len(key) + 1 + len(value) > MAX_VARIANT_CELL:
                report.report(
                    f"variants.{key}",
                    f"variant value {_clip(value)} is {len(value)} characters: a variant cell "
                    f"is stored as 'key=value,...' in columns of {MAX_VARIANT_CELL} characters "
                    f"(ProbeExecution.variant), and {key}=<value> alone is "
                    f"{len(key) + 1 + len(value)}; shorten the value",
                    line=report.line_within("variants", key),
                )
    if report.count() > before:
        return
    widest = {key: max(values, key=len) for key, values in variants.items()}
    cell = ",".join(f"{key}={widest[key]}" for key in sorted(widest))
    if len(cell) > MAX_VARIANT_CELL:
        report.report(
            "variants",
            f"the longest variant cell, {_clip(cell)}, is {len(cell)} characters: cells are "
            f"stored as 'key=value,...' in columns of {MAX_VARIANT_CELL} characters "
            "(ProbeExecution.variant); shorten variant keys or values, or use fewer keys",
        )


def _compares(
    raw: Mapping[str, Any], variants: dict[str, tuple[str, ...]] | None, report: _Table,
) -> tuple[Compare, ...] | None:
    """One table (``compare = {reference = ..., candidate = ...}`` or ``[probe.compare]``) or
    an array of them; either way a tuple of Compare, one per table."""
    raw_compare = raw.get("compare", [])
    single = isinstance(raw_compare, dict)
    entries = [raw_compare] if single else raw_compare
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        report.report(
            "compare",
            "compare must be a table, e.g. compare = {reference = {cp = \"off\"}, "
            "candidate = {cp = \"on\"}, rtol = 1e-5, atol = 1e-6}, or an array of such tables "
            f"for several rules, compare = [{{...}}, {{...}}]; got {_show(raw_compare)}",
        )
        return None
    before = report.count()
    result: list[Compare] = []
    # Entries appear in file order, so the k-th entry's key is that key's n-th occurrence.
    seen: dict[str, int] = dict.fromkeys(COMPARE_KEYS, 0)
    for index, entry in enumerate(entries, start=1):
        field = "compare" if single else f"compare[{index}]"
        lines: dict[str, int | None] = {}
        for key in entry:
            seen[key] = seen.get(key, 0) + 1
            lines[key] = report.line_within("compare", key, seen[key])
        entry_line = next(iter(lines.values()), report.line_of("compare"))
        for key in entry:
            if key not in COMPARE_KEYS:
                report.report(
                    f"{field}.{key}", _unknown_key("compare key", key, COMPARE_KEYS),
                    line=lines[key],
                )
        sides = {
            side: _compare_side(entry, side, field, variants, report, lines.get(side) or entry_line)
            for side in ("reference", "candidate")
        }
        tolerances = {
            key: _tolerance(entry, key, field, report, lines.get(key) or entry_line)
            for key in ("rtol", "atol")
        }
        reference, candidate = sides["reference"], sides["candidate"]
        if reference is not None and candidate is not None:
            if set(reference) != set(candidate):
                report.report(
                    field, "reference and candidate must name the same variant keys",
                    line=entry_line,
                )
            elif reference == candidate:
                report.report(
                    field, "reference and candidate name the same variant; nothing to compare",
                    line=entry_line,
                )
            else:
                result.append(
                    Compare(reference, candidate, tolerances["rtol"], tolerances["atol"])
                )
    return tuple(result) if report.count() == before else None


def _compare_side(
    entry: Mapping[str, Any], side: str, field: str,
    variants: dict[str, tuple[str, ...]] | None, report: _Table, line: int | None,
) -> dict[str, str] | None:
    where = f"{field}.{side}"
    chosen = entry.get(side)
    if chosen is None:
        report.report(where, f"{side} is required, e.g. {side} = {{cp = \"off\"}}", line=line)
        return None
    if not isinstance(chosen, dict) or not chosen:
        report.report(
            where, f"{side} must be a non-empty table of variant values, got {_show(chosen)}",
            line=line,
        )
        return None
    result: dict[str, str] = {}
    for key, value in chosen.items():
        text = _scalar_str(value)
        if text is None:
            report.report(
                where, f"the value of {key!r} must be a string, number or boolean", line=line
            )
            continue
        result[key] = text
        if variants is None:
            continue  # the variants' own problems are reported; checking against them is noise
        if key not in variants:
            known = ", ".join(variants) or "none: the probe has no variants"
            report.report(
                where,
                f"names unknown variant key {key!r}{_did_you_mean(key, list(variants))}; "
                f"variant keys: {known}",
                line=line,
            )
        elif text not in variants[key]:
            report.report(
                where,
                f"names unknown variant value {text!r} for {key!r}; its values: "
                f"{', '.join(variants[key])}",
                line=line,
            )
    return result if len(result) == len(chosen) else None


def _tolerance(
    entry: Mapping[str, Any], key: str, field: str, report: _Table, line: int | None,
) -> float:
    default = DEFAULT_RTOL if key == "rtol" else DEFAULT_ATOL
    value = entry.get(key, default)
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        report.report(
            f"{field}.{key}", f"{key} must be a number >= 0, got {_show(value)}", line=line
        )
        return default
    return float(value)


def _parse_knobs(raw: object, root: _Table, locator: _Locator) -> tuple[Knob, ...]:
    knobs: list[Knob] = []
    first_seen: dict[str, str] = {}
    example = ", e.g. [[knob]] with name, file, pattern and values or range"
    for index, table in _array_of_tables(raw, "knob", root, example):
        name = table.get("name")
        label = f"knob[{index}] {name!r}" if isinstance(name, str) and name else f"knob[{index}]"
        report = _table_for(root, locator, ("knob",), label, index)
        knob = _parse_knob(table, report)
        if isinstance(name, str) and name:
            if name in first_seen:
                other = first_seen[name]
                report.report("name", f"duplicate knob name {name!r}: {other} has it too")
                continue
            first_seen[name] = label
        if knob is not None:
            knobs.append(knob)
    return tuple(knobs)


def _parse_knob(raw: Mapping[str, Any], report: _Table) -> Knob | None:
    before = report.count()
    _check_keys(raw, KNOB_KEYS, report, "knob key")
    name = _name(raw, "name", report)
    file = _text(raw, "file", report, required=True)
    if file is not None:
        problem = _relative_path_problem(file, glob=False)
        if problem is not None:
            report.report("file", f"file {file!r} {problem}")
    pattern = _pattern(raw, report)
    values: tuple[str, ...] | None = None
    bounds: tuple[float, float, float | None] | None = None
    if ("values" in raw) == ("range" in raw):
        which = "both" if "values" in raw else "neither"
        report.report(
            None, f"a knob needs exactly one of values and range; this one has {which}"
        )
    elif "values" in raw:
        values = _scalar_list(raw["values"], "values", report, line=None, what="value")
    else:
        bounds = _range(raw["range"], report)
    description = _text(raw, "description", report, required=False) or ""
    skeleton = _text(raw, "skeleton", report, required=False) or ""
    if skeleton and not _SLUG.fullmatch(skeleton):
        report.report("skeleton", f"skeleton {skeleton!r} is not a skeleton's slug (lower-case "
                                  "words joined by hyphens, as /skeletons/<slug>/ names it)")
    if report.count() > before or name is None or file is None or pattern is None:
        return None
    return Knob(name, file, pattern, values=values, range=bounds, description=description,
                skeleton=skeleton)


def _pattern(raw: Mapping[str, Any], report: _Table) -> str | None:
    pattern = _text(raw, "pattern", report, required=True)
    if pattern is None:
        return None
    try:
        groups = re.compile(pattern, re.MULTILINE).groups
    except re.error as exc:
        report.report("pattern", f"pattern does not compile as a regular expression: {exc}")
        return None
    if groups != 1:
        report.report(
            "pattern",
            f"pattern must have exactly one capturing group (the value), it has {groups}; "
            "write other groups as (?:...)",
        )
        return None
    return pattern


def _range(raw: object, report: _Table) -> tuple[float, float, float | None] | None:
    shape = "range must be [low, high] or [low, high, step] with numbers"
    if not isinstance(raw, list) or len(raw) not in (2, 3):
        report.report("range", f"{shape}, got {_show(raw)}")
        return None
    if not all(_is_number(bound) and math.isfinite(bound) for bound in raw):
        report.report("range", f"{shape}, got {raw!r}")
        return None
    low, high = raw[0], raw[1]
    step = raw[2] if len(raw) == 3 else None
    if not low < high:
        report.report("range", f"range low ({low}) must be below high ({high})")
        return None
    if step is not None and step <= 0:
        report.report("range", f"range step must be > 0, got {step}")
        return None
    return (low, high, step)


def _parse_risk(raw: object, root: _Table, locator: _Locator) -> tuple[RiskRule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not all(isinstance(rule, dict) for rule in raw.values()):
        root.report(
            "risk",
            "risk must be a table of rules: write each rule as [risk.<name>] with category, "
            "reason and paths and/or patterns",
        )
        return ()
    rules: list[RiskRule] = []
    for name, table in raw.items():
        report = _table_for(root, locator, ("risk", name), f"risk.{name}")
        rule = _parse_risk_rule(name, table, report)
        if rule is not None:
            rules.append(rule)
    return tuple(rules)


def _parse_risk_rule(name: str, raw: Mapping[str, Any], report: _Table) -> RiskRule | None:
    before = report.count()
    if not _NAME_RE.fullmatch(name):
        report.report(None, f"rule name {name!r} must be {_NAME_RULE}")
    _check_keys(raw, RISK_KEYS, report, "risk rule key")
    category = _choice(raw, "category", RISK_CATEGORIES, report, default=None)
    reason = _text(raw, "reason", report, required=True)
    paths = _globs(raw, "paths", report, default=())
    patterns = _strings(raw, "patterns", report, what="pattern")
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            report.report("patterns", f"pattern {pattern!r} does not compile: {exc}")
    if "paths" not in raw and "patterns" not in raw:
        report.report(None, "a risk rule needs paths, patterns or both; this one has neither")
    if report.count() > before or category is None or reason is None:
        return None
    return RiskRule(name, category, reason, paths=paths, patterns=patterns)


# --- Field readers: each reports its own problems and returns a usable value or None -------


def _check_keys(raw: Mapping[str, Any], known: Sequence[str], report: _Table, what: str) -> None:
    for key in raw:
        if key not in known:
            report.report(key, _unknown_key(what, key, known))


def _unknown_key(what: str, key: str, known: Sequence[str]) -> str:
    hint = _did_you_mean(key, known)
    return f"unknown {what} {key!r}{hint or '; known: ' + ', '.join(known)}"


def _did_you_mean(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _text(raw: Mapping[str, Any], key: str, report: _Table, *, required: bool) -> str | None:
    value = raw.get(key)
    if value is None:
        if required:
            report.report(key, f"{key} is required")
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        report.report(key, f"{key} must be a non-empty string, got {_show(value)}")
        return None
    return value


def _name(
    raw: Mapping[str, Any], key: str, report: _Table, *, limit: tuple[int, str] | None = None,
) -> str | None:
    """A name; `limit` is (the column's length, what the column holds) when it is stored."""
    name = _text(raw, key, report, required=True)
    if name is not None and not _NAME_RE.fullmatch(name):
        report.report(key, f"{key} {name!r} must be {_NAME_RULE}")
        return None
    if name is not None and limit is not None and not _fits(name, *limit, key, report, what=key):
        return None
    return name


def _fits(text: str, limit: int, column: str, field: str, report: _Table, *, what: str) -> bool:
    """Whether `text` fits the `limit`-character column it is copied into; reported if not."""
    if len(text) <= limit:
        return True
    report.report(
        field, f"{what} {_clip(text)} is {len(text)} characters; {column} are stored in at most "
               f"{limit}, shorten it",
    )
    return False


def _clip(text: str, keep: int = 40) -> str:
    """`text` quoted for a message, its middle elided when long."""
    if len(text) <= keep:
        return repr(text)
    return repr(text[: keep // 2] + "..." + text[-(keep // 4):])


def _choice(
    raw: Mapping[str, Any], key: str, allowed: Sequence[str], report: _Table,
    *, default: str | None,
) -> str | None:
    value = raw.get(key)
    if value is None:
        if default is None:
            report.report(key, f"{key} is required: one of {', '.join(allowed)}")
        return default
    if not isinstance(value, str) or value not in allowed:
        hint = _did_you_mean(value, allowed) if isinstance(value, str) else ""
        report.report(key, f"{key} must be one of {', '.join(allowed)}; got {_show(value)}{hint}")
        return default
    return value


def _whole(
    raw: Mapping[str, Any], key: str, report: _Table, *, default: int, positive: bool,
) -> int:
    value: object = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "a positive whole number" if positive else "a whole number"
        report.report(key, f"{key} must be {kind}, got {_show(value)}")
        return default
    if positive and value <= 0:
        report.report(key, f"{key} must be a positive whole number, got {value}")
        return default
    return value


def _seconds(raw: Mapping[str, Any], key: str, report: _Table) -> float:
    value = raw.get(key, DEFAULT_TIMEOUT)
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        report.report(key, f"{key} must be a positive number of seconds, got {_show(value)}")
        return DEFAULT_TIMEOUT
    return float(value)


def _flag(raw: Mapping[str, Any], key: str, report: _Table) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        report.report(key, f"{key} must be true or false, got {_show(value)}")
        return False
    return value


def _strings(
    raw: Mapping[str, Any], key: str, report: _Table, *, what: str, required: bool = False,
    shape: tuple[re.Pattern[str], str] | None = None,
) -> tuple[str, ...]:
    """A list of distinct non-empty strings; () with a problem reported when it is not."""
    value = raw.get(key)
    if value is None:
        if required:
            report.report(key, f"{key} is required: a non-empty array of {what}s")
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        report.report(key, f"{key} must be an array of strings, got {_show(value)}")
        return ()
    if required and not value:
        report.report(key, f"{key} must list at least one {what}")
    for item in value:
        if not item.strip():
            report.report(key, f"{key} has an empty {what}")
        elif shape is not None and not shape[0].fullmatch(item):
            report.report(key, f"{what} {item!r} must be {shape[1]}")
    duplicates = sorted({item for item in value if value.count(item) > 1})
    if duplicates:
        report.report(key, f"{key} repeats {', '.join(map(repr, duplicates))}")
    return tuple(value)


def _globs(
    raw: Mapping[str, Any], key: str, report: _Table, *, default: tuple[str, ...],
) -> tuple[str, ...]:
    if key not in raw:
        return default
    globs = _strings(raw, key, report, what="glob")
    for glob in globs:
        problem = _relative_path_problem(glob, glob=True)
        if problem is not None and glob.strip():
            report.report(key, f"glob {glob!r} {problem}")
    return globs


def _scalar_list(
    value: object, field: str, report: _Table, *, line: int | None, what: str,
) -> tuple[str, ...] | None:
    """A non-empty array of strings, numbers or booleans, as distinct strings."""
    if not isinstance(value, list) or not value:
        report.report(field, f"{field} must be a non-empty array, got {_show(value)}", line=line)
        return None
    strings = [_scalar_str(item) for item in value]
    if any(text is None for text in strings):
        report.report(
            field, f"each {what} in {field} must be a string, number or boolean", line=line
        )
        return None
    texts = [text for text in strings if text is not None]
    duplicates = sorted({text for text in texts if texts.count(text) > 1})
    if duplicates:
        report.report(field, f"{field} repeats {', '.join(map(repr, duplicates))}", line=line)
        return None
    return tuple(texts)


def _scalar_str(value: object) -> str | None:
    """A TOML scalar as the string a probe sees; None for tables, arrays and dates."""
    if isinstance(value, bool):
        return "true" if value else "false"  # TOML's spelling, not Python's
    if isinstance(value, int | float | str):
        return str(value) if not isinstance(value, float) else repr(value)
    return None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _show(value: object) -> str:
    """A value as the author wrote it, for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return repr(value) if isinstance(value, str | int | float) else str(value)
