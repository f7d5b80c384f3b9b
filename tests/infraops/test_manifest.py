"""infraops.manifest: every validation rule, located; knobs; variant matrices; globs."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infraops.manifest import (
    LAYERS,
    Compare,
    ManifestError,
    ManifestProblem,
    Metric,
    Probe,
    glob_match,
    metric_defaults,
    parse_manifest,
)

# Lines 1-5. Cases append from line 6 on, so expected line numbers are easy to read off.
PROBE = """\
[[probe]]
name = "unit"
layer = "correctness"
command = "pytest -q"
metrics = ["passed"]
"""
UNIT = "probe[1] 'unit'"

# Lines 6-10 when appended to PROBE.
KNOB = """\
[[knob]]
name = "block"
file = "src/config.py"
pattern = '^BLOCK = (\\d+)$'
values = [16, 32]
"""
BLOCK = "knob[1] 'block'"

# Lines 6-9 when appended to PROBE.
RISK = """\
[risk.numerics]
category = "numerics"
reason = "kernels change results"
paths = ["src/kernels/**"]
"""
NUMERICS = "risk.numerics"

VARIANTS = 'variants = {cp = ["off", "on"]}\n'  # line 6 when appended to PROBE
OFF_ON = 'reference = {cp = "off"}, candidate = {cp = "on"}'


def _without(text: str, key: str) -> str:
    return "".join(
        line for line in text.splitlines(keepends=True) if not line.startswith(f"{key} =")
    )


def _replace(text: str, key: str, line: str) -> str:
    return "".join(
        f"{line}\n" if old.startswith(f"{key} =") else old
        for old in text.splitlines(keepends=True)
    )


def _layer(text: str, layer: str) -> str:
    return _replace(text, "layer", f'layer = "{layer}"')


def _problems(text: str) -> list[ManifestProblem]:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(text)
    return caught.value.problems


# (toml text, table, field, line, a phrase of the message)
CASES = [
    # top level
    pytest.param(PROBE + "[tool]\nx = 1\n", "(top level)", "tool", 6,
                 "unknown top-level key 'tool'", id="unknown-top-level-table"),
    pytest.param(PROBE + "[[probes]]\nname = 'x'\n", "(top level)", "probes", 6,
                 "did you mean 'probe'?", id="top-level-typo"),
    pytest.param("", "(top level)", "probe", None, "no [[probe]] table", id="no-probes"),
    pytest.param("probe = []\n", "(top level)", "probe", 1, "no [[probe]] table",
                 id="empty-probe-array"),
    pytest.param('[probe]\nname = "x"\n', "(top level)", "probe", 1, "write each one as [[probe]]",
                 id="probe-not-an-array"),
    pytest.param(PROBE + "timeout =\n", "(top level)", None, 6, "TOML syntax error",
                 id="syntax-error"),
    pytest.param("risk = 5\n" + PROBE, "(top level)", "risk", 1, "table of rules",
                 id="risk-not-a-table"),
    pytest.param('knob = "x"\n' + PROBE, "(top level)", "knob", 1, "[[knob]]",
                 id="knob-not-an-array"),
    # probe: required fields and names
    pytest.param(_without(PROBE, "name"), "probe[1]", "name", 1, "name is required",
                 id="probe-missing-name"),
    pytest.param(_without(PROBE, "command"), UNIT, "command", 1, "command is required",
                 id="probe-missing-command"),
    pytest.param(_without(PROBE, "layer"), UNIT, "layer", 1,
                 "one of correctness, behaviour, performance, e2e", id="probe-missing-layer"),
    pytest.param(_layer(_without(PROBE, "metrics"), "performance"), UNIT, "metrics", 1,
                 "metrics is required for a performance probe", id="performance-missing-metrics"),
    pytest.param(_layer(_without(PROBE, "metrics"), "behaviour"), UNIT, "metrics", 1,
                 "correctness probes may leave it out", id="behaviour-missing-metrics"),
    pytest.param(_layer(_without(PROBE, "metrics"), "e2e"), UNIT, "metrics", 1,
                 'e.g. metrics = ["tokens_per_s"]', id="e2e-missing-metrics"),
    pytest.param(_layer(_replace(PROBE, "metrics", "metrics = []"), "performance"), UNIT,
                 "metrics", 5, "at least one metric name for a performance probe (only "
                 "correctness probes may leave it out)", id="performance-empty-metrics"),
    pytest.param(_replace(PROBE, "metrics", 'metrics = "passed"'), UNIT, "metrics", 5,
                 "array of strings", id="correctness-metrics-not-an-array"),
    pytest.param(_without(PROBE, "metrics") + 'higher_is_better = ["passed"]\n', UNIT,
                 "higher_is_better", 5, "not one of this probe's metrics (it lists none)",
                 id="higher-is-better-without-metrics"),
    pytest.param(_replace(PROBE, "metrics", 'metrics = ["a", "a"]'), UNIT, "metrics", 5,
                 "repeats 'a'", id="probe-repeated-metric"),
    pytest.param(_replace(PROBE, "command", 'command = ""'), UNIT, "command", 4,
                 "non-empty string", id="probe-empty-command"),
    pytest.param(_replace(PROBE, "name", 'name = "my probe"'), "probe[1] 'my probe'", "name", 2,
                 "letters, digits", id="probe-name-with-space"),
    pytest.param(PROBE + "\n" + PROBE, "probe[2] 'unit'", "name", 8,
                 "duplicate probe name 'unit': probe[1] 'unit' on line 2", id="duplicate-probe"),
    pytest.param(_replace(PROBE, "layer", 'layer = "perfomance"'), UNIT, "layer", 3,
                 "one of correctness, behaviour, performance, e2e; got 'perfomance' "
                 "(did you mean 'performance'?)", id="unknown-layer"),
    # probe: numbers
    pytest.param(PROBE + "timeout = 0\n", UNIT, "timeout", 6, "positive number of seconds, got 0",
                 id="zero-timeout"),
    pytest.param(PROBE + "timeout = -5.0\n", UNIT, "timeout", 6, "got -5.0",
                 id="negative-timeout"),
    pytest.param(PROBE + 'timeout = "ten"\n', UNIT, "timeout", 6,
                 "timeout must be a positive number of seconds, got 'ten'", id="text-timeout"),
    pytest.param(PROBE + "timeout = inf\n", UNIT, "timeout", 6, "positive number",
                 id="infinite-timeout"),
    pytest.param(PROBE + "repeat = 0\n", UNIT, "repeat", 6, "positive whole number, got 0",
                 id="zero-repeat"),
    pytest.param(PROBE + "repeat = 2.5\n", UNIT, "repeat", 6, "positive whole number, got 2.5",
                 id="fractional-repeat"),
    pytest.param(PROBE + "cost = 1.5\n", UNIT, "cost", 6, "cost must be a whole number",
                 id="fractional-cost"),
    pytest.param(PROBE + "extra_repeats = -1\n", UNIT, "extra_repeats", 6,
                 "extra_repeats must be a whole number from 0 to 100, got -1",
                 id="negative-extra-repeats"),
    pytest.param(PROBE + "extra_repeats = 101\n", UNIT, "extra_repeats", 6,
                 "from 0 to 100, got 101", id="too-many-extra-repeats"),
    pytest.param(PROBE + 'extra_repeats = "ten"\n', UNIT, "extra_repeats", 6,
                 "extra_repeats must be a whole number, got 'ten'", id="text-extra-repeats"),
    pytest.param(PROBE + 'cost = "cheap"\n', UNIT, "cost", 6, "got 'cheap'", id="text-cost"),
    pytest.param(PROBE + "cost = true\n", UNIT, "cost", 6, "got true", id="boolean-cost"),
    # probe: covers and files
    pytest.param(PROBE + 'covers = [""]\n', UNIT, "covers", 6, "empty glob", id="empty-glob"),
    pytest.param(PROBE + 'covers = ["/src/**"]\n', UNIT, "covers", 6, "is absolute",
                 id="absolute-glob"),
    pytest.param(PROBE + 'covers = ["src/../x/**"]\n', UNIT, "covers", 6, "contains '..'",
                 id="glob-leaving-the-repo"),
    pytest.param(PROBE + 'covers = ["./src/**"]\n', UNIT, "covers", 6, "'.' segment",
                 id="glob-with-dot-segment"),
    pytest.param(PROBE + 'covers = "src/**"\n', UNIT, "covers", 6, "array of strings",
                 id="covers-not-an-array"),
    pytest.param(PROBE + "covers = []\n", UNIT, "covers", 6, "never be chosen",
                 id="covers-empty"),
    pytest.param(PROBE + 'files = ["/etc/passwd"]\n', UNIT, "files", 6, "is absolute",
                 id="absolute-probe-file"),
    # probe: variants
    pytest.param(PROBE + 'variants = ["off", "on"]\n', UNIT, "variants", 6, "table of arrays",
                 id="variants-not-a-table"),
    pytest.param(PROBE + 'variants = {cp = "on"}\n', UNIT, "variants.cp", 6,
                 "variants.cp must be a non-empty array, got 'on'", id="variant-not-a-list"),
    pytest.param(PROBE + "variants = {cp = []}\n", UNIT, "variants.cp", 6, "non-empty array",
                 id="variant-empty-list"),
    pytest.param(PROBE + 'variants = {cp = [1, "1"]}\n', UNIT, "variants.cp", 6, "repeats '1'",
                 id="variant-repeated-value"),
    pytest.param(PROBE + "variants = {cp = [{a = 1}]}\n", UNIT, "variants.cp", 6,
                 "string, number or boolean", id="variant-table-value"),
    pytest.param(PROBE + 'variants = {"1x" = ["a"]}\n', UNIT, "variants.1x", 6,
                 "environment variable", id="variant-key-not-an-env-name"),
    pytest.param(PROBE + 'variants = {infraops_seed = ["1"]}\n', UNIT, "variants.infraops_seed",
                 6, "INFRAOPS_", id="variant-key-reserved"),
    pytest.param(PROBE + 'variants = {cp = ["a"], CP = ["b"]}\n', UNIT, "variants.CP", 6,
                 "same environment variable CP", id="variant-keys-colliding"),
    pytest.param(PROBE + '[probe.variants]\ndtype = ["bf16"]\ncp = "on"\n', UNIT, "variants.cp",
                 8, "non-empty array", id="variant-in-a-sub-table"),
    # probe: compare
    pytest.param(PROBE + VARIANTS + 'compare = [{reference = {dtype = "off"}, '
                 'candidate = {cp = "on"}}]\n', UNIT, "compare[1].reference", 7,
                 "unknown variant key 'dtype'", id="compare-unknown-key"),
    pytest.param(PROBE + VARIANTS + 'compare = [{reference = {cp = "off"}, '
                 'candidate = {cp = "maybe"}}]\n', UNIT, "compare[1].candidate", 7,
                 "unknown variant value 'maybe' for 'cp'; its values: off, on",
                 id="compare-unknown-value"),
    pytest.param(PROBE + 'compare = [{reference = {cp = "off"}, candidate = {cp = "on"}}]\n',
                 UNIT, "compare[1].reference", 6, "the probe has no variants",
                 id="compare-without-variants"),
    pytest.param(PROBE + VARIANTS + 'compare = [{reference = {cp = "off"}, '
                 'candidate = {cp = "on"}, rtol = -1e-3}]\n', UNIT, "compare[1].rtol", 7,
                 "rtol must be a number >= 0, got -0.001", id="negative-rtol"),
    pytest.param(PROBE + VARIANTS + 'compare = [{reference = {cp = "off"}, '
                 'candidate = {cp = "on"}, atol = -1}]\n', UNIT, "compare[1].atol", 7,
                 "atol must be a number >= 0", id="negative-atol"),
    pytest.param(PROBE + VARIANTS + "compare = [\n"
                 '  {reference = {cp = "off"}, candidate = {cp = "on"}, rtol = 1e-5},\n'
                 '  {reference = {cp = "on"}, candidate = {cp = "off"}, rtol = -1},\n'
                 "]\n", UNIT, "compare[2].rtol", 9, "got -1",
                 id="negative-rtol-in-second-entry"),
    pytest.param(PROBE + VARIANTS + "[[probe.compare]]\n"
                 'reference = {cp = "off"}\ncandidate = {cp = "on"}\natol = "tiny"\n', UNIT,
                 "compare[1].atol", 10, "got 'tiny'", id="compare-as-sub-tables"),
    pytest.param(PROBE + VARIANTS + 'compare = [{reference = {cp = "off"}, '
                 'candidate = {cp = "off"}}]\n', UNIT, "compare[1]", 7, "nothing to compare",
                 id="compare-same-variant"),
    pytest.param(PROBE + VARIANTS + 'compare = [{reference = {cp = "off"}}]\n', UNIT,
                 "compare[1].candidate", 7, "candidate is required", id="compare-no-candidate"),
    pytest.param(PROBE + VARIANTS + 'compare = [{reference = {cp = "off"}, '
                 'candidate = {cp = "on"}, rtl = 0.1}]\n', UNIT, "compare[1].rtl", 7,
                 "did you mean 'rtol'?", id="compare-key-typo"),
    pytest.param(PROBE + VARIANTS + "compare = 5\n", UNIT, "compare", 7,
                 "compare must be a table, e.g. compare = {reference", id="compare-a-number"),
    pytest.param(PROBE + VARIANTS + 'compare = "cp"\n', UNIT, "compare", 7,
                 "or an array of such tables for several rules", id="compare-a-string"),
    pytest.param(PROBE + VARIANTS + f"compare = [{{{OFF_ON}}}, 1]\n", UNIT, "compare", 7,
                 "got an array", id="compare-array-with-a-number"),
    # probe: compare written as one table: the same rules, fields named compare.<key>
    pytest.param(PROBE + VARIANTS + 'compare = {reference = {cp = "off"}}\n', UNIT,
                 "compare.candidate", 7, "candidate is required", id="one-compare-no-candidate"),
    pytest.param(PROBE + VARIANTS + f"compare = {{{OFF_ON}, rtol = -1}}\n", UNIT,
                 "compare.rtol", 7, "rtol must be a number >= 0, got -1",
                 id="one-compare-negative-rtol"),
    pytest.param(PROBE + VARIANTS + 'compare = {reference = {cp = "of"}, '
                 'candidate = {cp = "on"}}\n', UNIT, "compare.reference", 7,
                 "unknown variant value 'of'", id="one-compare-unknown-value"),
    pytest.param(PROBE + VARIANTS + 'compare = {reference = {cp = "on"}, '
                 'candidate = {cp = "on"}}\n', UNIT, "compare", 7, "nothing to compare",
                 id="one-compare-same-variant"),
    pytest.param(PROBE + VARIANTS + f"compare = {{{OFF_ON}, tol = 1}}\n", UNIT,
                 "compare.tol", 7, "unknown compare key 'tol'", id="one-compare-unknown-key"),
    pytest.param(PROBE + f"compare = {{{OFF_ON}}}\n", UNIT, "compare.reference", 6,
                 "the probe has no variants", id="one-compare-without-variants"),
    pytest.param(PROBE + VARIANTS + "compare = {}\n", UNIT, "compare.reference", 7,
                 "reference is required", id="one-compare-empty"),
    pytest.param(PROBE + VARIANTS + "[probe.compare]\n"
                 'reference = {cp = "off"}\ncandidate = {cp = "on"}\natol = "tiny"\n', UNIT,
                 "compare.atol", 10, "got 'tiny'", id="one-compare-as-a-sub-table"),
    # probe: the rest
    pytest.param(PROBE + 'measure = "cycles"\n', UNIT, "measure", 6, "one of wall, instructions",
                 id="unknown-measure"),
    pytest.param(PROBE + "timout = 10\n", UNIT, "timout", 6,
                 "unknown probe key 'timout' (did you mean 'timeout'?)", id="probe-key-typo"),
    pytest.param(PROBE + "zzz = 10\n", UNIT, "zzz", 6, "known: name, layer",
                 id="probe-key-unknown"),
    pytest.param(PROBE + 'always = "yes"\n', UNIT, "always", 6, "true or false",
                 id="always-not-a-boolean"),
    pytest.param(PROBE + "compile_cache = 1\n", UNIT, "compile_cache", 6, "true or false",
                 id="compile-cache-not-a-boolean"),
    pytest.param(PROBE + 'requires = "gpu"\n', UNIT, "requires", 6, "array of strings",
                 id="requires-not-an-array"),
    pytest.param(PROBE + 'requires = ["a gpu"]\n', UNIT, "requires", 6,
                 "requirement 'a gpu' must be letters", id="requires-not-a-queue-name"),
    # knobs
    pytest.param(PROBE + _replace(KNOB, "pattern", "pattern = '(\\d+'"), BLOCK, "pattern", 9,
                 "does not compile", id="knob-pattern-not-compiling"),
    pytest.param(PROBE + _replace(KNOB, "pattern", "pattern = 'BLOCK = \\d+'"), BLOCK, "pattern",
                 9, "exactly one capturing group (the value), it has 0", id="knob-no-group"),
    pytest.param(PROBE + _replace(KNOB, "pattern", "pattern = '(BLOCK) = (\\d+)'"), BLOCK,
                 "pattern", 9, "it has 2", id="knob-two-groups"),
    pytest.param(PROBE + KNOB + "range = [1, 2]\n", BLOCK, None, 6, "this one has both",
                 id="knob-values-and-range"),
    pytest.param(PROBE + _without(KNOB, "values"), BLOCK, None, 6, "this one has neither",
                 id="knob-neither-values-nor-range"),
    pytest.param(PROBE + _replace(KNOB, "file", 'file = "/etc/config.py"'), BLOCK, "file", 8,
                 "is absolute", id="knob-file-absolute"),
    pytest.param(PROBE + _replace(KNOB, "file", 'file = "../config.py"'), BLOCK, "file", 8,
                 "contains '..'", id="knob-file-outside"),
    pytest.param(PROBE + _replace(KNOB, "file", 'file = "src/*.py"'), BLOCK, "file", 8,
                 "one file", id="knob-file-glob"),
    pytest.param(PROBE + _without(KNOB, "file"), BLOCK, "file", 6, "file is required",
                 id="knob-missing-file"),
    pytest.param(PROBE + _without(KNOB, "name"), "knob[1]", "name", 6, "name is required",
                 id="knob-missing-name"),
    pytest.param(PROBE + _replace(KNOB, "values", "values = []"), BLOCK, "values", 10,
                 "non-empty array", id="knob-empty-values"),
    pytest.param(PROBE + _replace(KNOB, "values", "range = [1]"), BLOCK, "range", 10,
                 "[low, high] or [low, high, step]", id="knob-range-too-short"),
    pytest.param(PROBE + _replace(KNOB, "values", 'range = [1, "8"]'), BLOCK, "range", 10,
                 "with numbers", id="knob-range-text"),
    pytest.param(PROBE + _replace(KNOB, "values", "range = [8, 1]"), BLOCK, "range", 10,
                 "low (8) must be below high (1)", id="knob-range-reversed"),
    pytest.param(PROBE + _replace(KNOB, "values", "range = [1, 8, 0]"), BLOCK, "range", 10,
                 "step must be > 0", id="knob-range-zero-step"),
    pytest.param(PROBE + KNOB + 'valeus = ["x"]\n', BLOCK, "valeus", 11,
                 "did you mean 'values'?", id="knob-key-typo"),
    pytest.param(PROBE + KNOB + "\n" + KNOB, "knob[2] 'block'", "name", 13,
                 "duplicate knob name 'block'", id="duplicate-knob"),
    # risk rules
    pytest.param(PROBE + _replace(RISK, "category", 'category = "money"'), NUMERICS, "category",
                 7, "one of numerics, concurrency, production", id="risk-bad-category"),
    pytest.param(PROBE + _without(RISK, "category"), NUMERICS, "category", 6,
                 "category is required", id="risk-missing-category"),
    pytest.param(PROBE + _without(RISK, "reason"), NUMERICS, "reason", 6, "reason is required",
                 id="risk-missing-reason"),
    pytest.param(PROBE + _without(RISK, "paths"), NUMERICS, None, 6, "paths, patterns or both",
                 id="risk-neither-paths-nor-patterns"),
    pytest.param(PROBE + RISK + "patterns = ['(float']\n", NUMERICS, "patterns", 10,
                 "does not compile", id="risk-pattern-not-compiling"),
    pytest.param(PROBE + _replace(RISK, "paths", 'paths = ["/src/**"]'), NUMERICS, "paths", 9,
                 "is absolute", id="risk-absolute-path"),
    pytest.param(PROBE + RISK + 'path = ["x"]\n', NUMERICS, "path", 10,
                 "did you mean 'paths'?", id="risk-key-typo"),
    pytest.param(PROBE + "[risk]\nnumerics = 1\n", "(top level)", "risk", 6, "table of rules",
                 id="risk-rule-not-a-table"),
]


@pytest.mark.parametrize(("text", "table", "field", "line", "phrase"), CASES)
def test_it_reports_the_problem_where_it_is_written(
    text: str, table: str, field: str | None, line: int | None, phrase: str,
) -> None:
    problems = _problems(text)
    matching = [p for p in problems if p.table == table and p.field == field]
    assert len(matching) == 1, problems
    assert matching[0].line == line
    assert phrase in matching[0].message


def test_the_base_tables_are_valid() -> None:
    manifest = parse_manifest(PROBE + KNOB + RISK)
    assert [p.name for p in manifest.probes] == ["unit"]
    assert [k.name for k in manifest.knobs] == ["block"]
    assert [r.name for r in manifest.risk] == ["numerics"]


def test_it_reports_every_problem_not_just_the_first() -> None:
    text = PROBE + "timeout = 0\nrepeat = 0\ncost = 1.5\n" + _without(KNOB, "values")
    problems = _problems(text)
    assert [(p.table, p.field, p.line) for p in problems] == [
        (UNIT, "timeout", 6), (UNIT, "repeat", 7), (UNIT, "cost", 8), (BLOCK, None, 9),
    ]


def test_a_syntax_error_is_one_problem_with_tomllibs_line() -> None:
    problems = _problems('[[probe]]\nname = "unit"\nlayer = correctness\n')
    assert len(problems) == 1
    assert problems[0].line == 3
    assert problems[0].message.startswith("TOML syntax error: Invalid value")


def test_lines_inside_multi_line_strings_are_not_mistaken_for_keys() -> None:
    text = PROBE.replace(
        'command = "pytest -q"', 'command = """\ntimeout = 1\n[[probe]]\n"""'
    ) + "timeout = -1\n"
    problems = _problems(text)
    assert [(p.table, p.field, p.line) for p in problems] == [(UNIT, "timeout", 9)]


def test_an_inline_probe_is_located_at_its_key() -> None:
    text = (
        'probe = [\n  {name = "a", layer = "e2e", command = "x", metrics = ["m"], cost = 0.5},\n'
        "]\n"
    )
    problems = _problems(text)
    assert [(p.table, p.field, p.line) for p in problems] == [("probe[1] 'a'", "cost", 1)]


def test_a_problem_reads_as_line_table_field_and_message() -> None:
    problem = ManifestProblem("probe[2] 'decode-bench'", "timeout", 12, "timeout is bad")
    assert str(problem) == "line 12, probe[2] 'decode-bench', field timeout: timeout is bad"
    assert str(ManifestProblem("(top level)", None, None, "empty")) == "(top level): empty"


def test_the_error_joins_its_problems_and_survives_pickling() -> None:
    problems = [ManifestProblem("a", None, 1, "one"), ManifestProblem("b", "f", 2, "two")]
    error = ManifestError(problems)
    assert str(error) == "line 1, a: one\nline 2, b, field f: two"
    copy = pickle.loads(pickle.dumps(error))
    assert copy.problems == problems
    assert str(copy) == str(error)


# --- A complete manifest and its defaults --------------------------------------------------

EXAMPLE = """\
[[probe]]
name = "decode-bench"
layer = "performance"
command = "python bench/decode.py"
metrics = ["tokens_per_s", "p50_ms"]
cost = 2
timeout = 900
covers = ["src/kernels/**", "bench/**"]
variants = {cp = ["off", "on"], batch = [1, 8]}
compare = [{reference = {cp = "off"}, candidate = {cp = "on"}, rtol = 1e-5, atol = 1e-6}]
requires = ["gpu"]
measure = "instructions"
files = ["bench/decode.py", "bench/fixtures/"]

[[probe]]
name = "unit"
layer = "correctness"
command = "pytest -q"
metrics = ["failed"]
always = true

[[knob]]
name = "block-size"
file = "src/kernels/config.py"
pattern = '^BLOCK_SIZE = (\\d+)$'
range = [16, 256, 16]
description = "tile size of the decode kernel"

[risk.numerics]
category = "numerics"
reason = "kernel changes can change numerical results"
paths = ["src/kernels/**"]
patterns = ['\\bfloat16\\b']
"""


def test_it_parses_a_complete_manifest() -> None:
    manifest = parse_manifest(EXAMPLE)
    bench = manifest.probe("decode-bench")
    assert bench is not None
    assert bench.variants == {"cp": ("off", "on"), "batch": ("1", "8")}
    assert bench.compare == (Compare({"cp": "off"}, {"cp": "on"}, rtol=1e-5, atol=1e-6),)
    assert (bench.cost, bench.timeout, bench.repeat, bench.measure) == (2, 900.0, 5, "instructions")
    assert bench.requires == ("gpu",)
    assert manifest.knobs[0].range == (16, 256, 16)
    assert manifest.risk[0].patterns == ("\\bfloat16\\b",)
    # measure = "instructions": the runner's callgrind count is one of the probe's metrics.
    assert manifest.metrics() == {"decode-bench": ("tokens_per_s", "p50_ms", "instructions"),
                                  "unit": ("failed",)}
    assert manifest.protected_paths() == ("infraops.toml", "bench/decode.py", "bench/fixtures/")
    assert manifest.probe("missing") is None
    assert manifest.knob("block-size") is manifest.knobs[0]


@pytest.mark.parametrize(("layer", "repeat"), [
    ("correctness", 1), ("behaviour", 1), ("performance", 5), ("e2e", 5),
])
def test_defaults_follow_the_layer(layer: str, repeat: int) -> None:
    probe = parse_manifest(_replace(PROBE, "layer", f'layer = "{layer}"')).probes[0]
    assert probe.repeat == repeat
    # No warm-up executions (the samples show a first-run outlier); extra repeats that may
    # decide an inconclusive comparison: twice the repeats where samples are compared.
    assert probe.warmup == 0
    assert probe.extra_repeats == (10 if repeat == 5 else 0)
    assert (probe.cost, probe.timeout, probe.covers) == (1, 600.0, ("**",))
    assert (probe.variants, probe.compare, probe.requires, probe.files) == ({}, (), (), ())
    assert (probe.measure, probe.always, probe.compile_cache) == ("wall", False, False)
    assert parse_manifest(PROBE + "compile_cache = true\n").probes[0].compile_cache


# --- Natural forms: optional metrics, one compare table ----------------------------------


@pytest.mark.parametrize(("text", "metrics"), [
    pytest.param(_without(PROBE, "metrics"), (), id="left-out"),
    pytest.param(_replace(PROBE, "metrics", "metrics = []"), (), id="empty"),
    pytest.param(PROBE, ("passed",), id="listed"),
    pytest.param(_without(PROBE, "metrics") + 'measure = "instructions"\n', ("instructions",),
                 id="left-out-measuring-instructions"),
])
def test_a_correctness_probe_may_leave_metrics_out(text: str, metrics: tuple[str, ...]) -> None:
    probe = parse_manifest(text).probes[0]
    assert probe.metrics == metrics
    assert parse_manifest(text).metrics() == {"unit": metrics}


@pytest.mark.parametrize("layer", ["behaviour", "performance", "e2e"])
def test_the_other_layers_still_require_metrics(layer: str) -> None:
    (problem,) = _problems(_layer(_without(PROBE, "metrics"), layer))
    assert (problem.field, problem.line) == ("metrics", 1)
    assert problem.message.startswith(f"metrics is required for a {layer} probe")
    assert "only correctness probes may leave it out" in problem.message


@pytest.mark.parametrize("layer", ['"perfomance"', "5"])
def test_metrics_are_not_judged_while_the_layer_is_invalid(layer: str) -> None:
    text = _replace(_without(PROBE, "metrics"), "layer", f"layer = {layer}")
    assert [p.field for p in _problems(text)] == ["layer"]


TWO_RULES = (
    Compare({"cp": "off"}, {"cp": "on"}, rtol=1e-3, atol=0.0),
    Compare({"cp": "on"}, {"cp": "off"}),
)


@pytest.mark.parametrize(("compare", "expected"), [
    pytest.param(f"compare = {{{OFF_ON}, rtol = 1e-3, atol = 0}}\n", TWO_RULES[:1],
                 id="one-table"),
    pytest.param(f"compare = [{{{OFF_ON}, rtol = 1e-3, atol = 0}}]\n", TWO_RULES[:1],
                 id="array-of-one"),
    pytest.param('[probe.compare]\nreference = {cp = "off"}\ncandidate = {cp = "on"}\n'
                 "rtol = 1e-3\natol = 0\n", TWO_RULES[:1], id="one-sub-table"),
    pytest.param('[[probe.compare]]\nreference = {cp = "off"}\ncandidate = {cp = "on"}\n'
                 "rtol = 1e-3\natol = 0\n", TWO_RULES[:1], id="array-of-sub-tables"),
    pytest.param(f"compare = [{{{OFF_ON}, rtol = 1e-3, atol = 0}},\n"
                 '  {reference = {cp = "on"}, candidate = {cp = "off"}}]\n', TWO_RULES,
                 id="array-of-two"),
    pytest.param("compare = []\n", (), id="empty-array"),
    pytest.param("", (), id="left-out"),
])
def test_compare_is_one_table_or_an_array_of_them(
    compare: str, expected: tuple[Compare, ...],
) -> None:
    assert parse_manifest(PROBE + VARIANTS + compare).probes[0].compare == expected


@pytest.mark.parametrize(("lines", "extra"), [
    ("repeat = 20\n", 40), ("repeat = 80\n", 100), ("extra_repeats = 0\n", 0),
    ("extra_repeats = 3\n", 3), ("repeat = 7\nextra_repeats = 100\n", 100),
])
def test_the_extra_repeat_budget_is_stated_or_follows_the_repeats(lines: str, extra: int
                                                                  ) -> None:
    text = _replace(PROBE, "layer", 'layer = "performance"') + lines
    assert parse_manifest(text).probes[0].extra_repeats == extra


@pytest.mark.parametrize(("lines", "least"), [
    ("repeat = 3\nextra_repeats = 0\n", 5), ("repeat = 4\nextra_repeats = 0\n", 5),
    ("repeat = 3\nextra_repeats = 2\n", 5), ("repeat = 4\nextra_repeats = 1\n", 5),
])
def test_a_repeat_plan_that_can_never_call_a_change_is_refused_with_the_least_that_can(
    lines: str, least: int,
) -> None:
    [problem] = _problems(_layer(PROBE, "performance") + lines)
    assert problem.field == "repeat"
    assert "can never call a change improved or regressed" in problem.message
    assert f"Set repeat = {least} or more" in problem.message


@pytest.mark.parametrize("lines", [
    "repeat = 5\nextra_repeats = 0\n", "repeat = 3\n",  # three looks, 3, 6 and 9 a side
    "repeat = 1\n", "repeat = 2\nextra_repeats = 0\n",  # single measurements: no comparison
])
def test_a_repeat_plan_that_can_decide_or_compares_nothing_is_accepted(lines: str) -> None:
    assert parse_manifest(_layer(PROBE, "performance") + lines).probes


def test_a_huge_repeat_is_accepted_without_an_exact_binomial_of_it() -> None:
    # C(2n, n) of a trillion would never finish and overflows a float: the plan is judged in
    # logarithms.
    text = _layer(PROBE, "performance") + "repeat = 1000000000000\nextra_repeats = 0\n"
    assert parse_manifest(text).probes[0].repeat == 10**12


def test_a_correctness_probe_may_repeat_three_times() -> None:
    assert parse_manifest(PROBE + "repeat = 3\n").probes[0].repeat == 3


def test_an_explicit_repeat_wins_over_the_layer_default() -> None:
    text = _replace(PROBE, "layer", 'layer = "performance"') + "repeat = 2\n"
    assert parse_manifest(text).probes[0].repeat == 2


def test_every_layer_is_accepted() -> None:
    for layer in LAYERS:
        parse_manifest(_replace(PROBE, "layer", f'layer = "{layer}"'))


def test_variant_values_become_toml_spelled_strings() -> None:
    text = PROBE + "variants = {flag = [true, false], n = [1, 2.5]}\n"
    assert parse_manifest(text).probes[0].variants == {
        "flag": ("true", "false"), "n": ("1", "2.5"),
    }


# --- variant_matrix and covers -------------------------------------------------------------


def _probe(**changes: object) -> Probe:
    fields: dict[str, object] = {
        "name": "p", "layer": "correctness", "command": "true", "metrics": ("m",), "repeat": 1,
    }
    return Probe(**(fields | changes))  # type: ignore[arg-type]


def test_a_probe_without_variants_has_one_empty_cell() -> None:
    assert _probe().variant_matrix() == [{}]


def test_the_variant_matrix_is_the_cartesian_product_in_manifest_order() -> None:
    probe = _probe(variants={"cp": ("off", "on"), "batch": ("1", "8", "32")})
    matrix = probe.variant_matrix()
    assert len(matrix) == 6
    assert matrix[0] == {"cp": "off", "batch": "1"}
    assert matrix[-1] == {"cp": "on", "batch": "32"}
    assert len({tuple(cell.items()) for cell in matrix}) == 6


@pytest.mark.parametrize(("pattern", "path", "expected"), [
    ("**", "a/b/c.py", True),
    ("src/**", "src/a.py", True),
    ("src/**", "src/x/y/a.py", True),
    ("src/**", "srcx/a.py", False),
    ("**/*.py", "a.py", True),
    ("**/*.py", "a/b/c.py", True),
    ("**/*.py", "a/b/c.pyc", False),
    ("*.py", "b.py", True),
    ("*.py", "a/b.py", False),
    ("src/**/test_*.py", "src/test_a.py", True),
    ("src/**/test_*.py", "src/x/y/test_a.py", True),
    ("src/**/test_*.py", "src/x/a.py", False),
    ("a/**/b/**/c", "a/b/c", True),
    ("a/**/b/**/c", "a/x/b/y/z/c", True),
    ("a/**/b/**/c", "a/x/y/c", False),
    ("a/*/c", "a/b/c", True),
    ("a/*/c", "a/b/x/c", False),
    ("a/?.py", "a/b.py", True),
    ("a/[bc].py", "a/c.py", True),
    ("src/kernels/", "src/kernels/attn/a.cu", True),
    ("Src/**", "src/a.py", False),
    ("**", "/etc/passwd", False),
    ("src/a.py", "./src/a.py", True),
])
def test_glob_match(pattern: str, path: str, expected: bool) -> None:
    assert glob_match(pattern, path) is expected


def test_covers_any_matches_when_one_path_matches_one_glob() -> None:
    probe = _probe(covers=("src/kernels/**", "bench/*.py"))
    assert probe.covers_any(["docs/x.md", "bench/decode.py"])
    assert probe.covers_any(iter(["src/kernels/a/b.cu"]))
    assert not probe.covers_any(["docs/x.md", "bench/sub/decode.py"])
    assert not probe.covers_any([])


# --- Nothing but ManifestError escapes -----------------------------------------------------

_FRAGMENTS = st.sampled_from([
    "[[probe]]", "[[knob]]", "[risk.x]", "[risk]", "[probe.variants]", "[[probe.compare]]",
    'name = "a"', "name = 1", 'layer = "e2e"', 'layer = "x"', 'command = "c"',
    'metrics = ["m"]', "metrics = []", "timeout = -1", "timeout = nan", "repeat = 0",
    'covers = ["/x"]', 'covers = ["**"]', 'variants = {cp = ["a", "b"]}', "variants = {cp = 1}",
    'compare = [{reference = {cp = "a"}, candidate = {cp = "b"}}]', "compare = [1]",
    'compare = [{reference = {}, candidate = {cp = [1]}}]', 'file = "f"', "pattern = '(x)'",
    "pattern = '('", "values = [1]", "[probe.compare]", "compare = {}", "compare = 1",
    'compare = {reference = {cp = "a"}, candidate = {cp = "b"}, rtol = -1}',
    "range = [0, 1, 0.5]", "range = [1e308, 2e308]",
    'category = "numerics"', 'reason = "r"', 'paths = ["p"]', "patterns = ['(']",
    'cp = ["a"]', 'reference = {cp = "a"}', "x = {a = {b = 1}}", "d = 1979-05-27", '"""',
])


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_text_raises_only_manifest_error(text: str) -> None:
    try:
        parse_manifest(text)
    except ManifestError as error:
        assert error.problems
        assert all(isinstance(p, ManifestProblem) for p in error.problems)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(_FRAGMENTS, st.text(max_size=12)), max_size=25))
def test_manifest_like_text_raises_only_manifest_error(lines: list[str]) -> None:
    try:
        parse_manifest("\n".join(lines))
    except ManifestError as error:
        assert error.problems
        assert all(isinstance(p.line, int | None) for p in error.problems)


PERF = """\
[[probe]]
name = "bench"
layer = "performance"
command = "python bench.py"
"""


@pytest.mark.parametrize(("name", "kind", "direction", "unit"), [
    ("decode_us", "time", "minimize", "us"), ("decode_us_b64", "time", "minimize", "us"),
    ("latency_ms", "time", "minimize", "ms"), ("instructions", "time", "minimize",
                                              "instructions"),
    ("tokens_per_s", "throughput", "maximize", "/s"), ("gflops", "throughput", "maximize", "/s"),
    ("rel_error", "error", "minimize", ""), ("err_ratio", "error", "minimize", ""),
    ("max_abs_error", "error", "minimize", ""), ("registers", "count", "minimize", ""),
    ("spills", "count", "minimize", ""), ("num_warps", "count", "minimize", ""),
    ("programs_per_head", "count", "minimize", ""), ("peak_memory_mb", "memory", "minimize",
                                                     "MB"),
    ("slowest_retention", "ratio", "minimize", ""), ("hit_rate", "ratio", "minimize", ""),
    ("score", "time", "minimize", ""),  # nothing in the name says: a cost, as before kinds
])
def test_a_metric_kind_follows_from_its_name(name: str, kind: str, direction: str,
                                             unit: str) -> None:
    probe = parse_manifest(PERF + f'metrics = ["{name}"]\n').probes[0]

    assert probe.metric(name) == Metric(name, kind, direction, unit)
    assert probe.metric(name) == metric_defaults(name)


def test_a_metric_table_declares_its_kind_direction_unit_and_margin() -> None:
    probe = parse_manifest(PERF + (
        'metrics = ["merge_us", {name = "quality", kind = "ratio", direction = "maximize"},\n'
        '           {name = "rel_error", margin = 0.05}, {name = "hbm", kind = "memory", '
        'unit = "GiB"}]\n')).probes[0]

    assert probe.metrics == ("merge_us", "quality", "rel_error", "hbm")
    assert probe.metric("quality") == Metric("quality", "ratio", "maximize")
    assert probe.metric("rel_error") == Metric("rel_error", "error", "minimize", margin=0.05)
    assert probe.metric("hbm") == Metric("hbm", "memory", "minimize", "GiB")
    assert probe.metric("merge_us").performance and not probe.metric("rel_error").performance


def test_higher_is_better_still_turns_a_metric_around() -> None:
    probe = parse_manifest(PERF + 'metrics = ["score"]\nhigher_is_better = ["score"]\n'
                           ).probes[0]

    assert probe.direction("score") == "maximize"


@pytest.mark.parametrize(("table", "field", "message"), [
    ('{name = "x", kind = "speed"}', "metrics[1].kind",
     "kind must be one of time, throughput, error, count, memory, ratio; got 'speed'"),
    ('{name = "x", direction = "up"}', "metrics[1].direction",
     "direction must be one of minimize, maximize"),
    ('{name = "x", margin = 1.5}', "metrics[1].margin", "a number between 0 and 1"),
    ('{name = "x", margin = true}', "metrics[1].margin", "a number between 0 and 1"),
    ('{name = "x", unit = "' + "u" * 41 + '"}', "metrics[1].unit", "at most 40 characters"),
    ('{name = "x", kinds = "time"}', "metrics[1].kinds", "(did you mean 'kind'?)"),
    ('{kind = "error"}', "metrics[1].name", "a metric table needs a name"),
], ids=["kind", "direction", "margin", "margin-bool", "unit", "unknown-key", "no-name"])
def test_a_bad_metric_table_is_named_with_its_line(table: str, field: str, message: str
                                                   ) -> None:
    with pytest.raises(ManifestError) as raised:
        parse_manifest(PERF + f"metrics = [{table}]\n")

    [problem] = raised.value.problems
    assert (problem.field, problem.line) == (field, 5)
    assert message in problem.message


@pytest.mark.parametrize("table", ["[[criterion]]", "[criteria]", "[[acceptance]]"])
def test_criteria_in_the_manifest_are_sent_to_the_goal_editor(table: str) -> None:
    with pytest.raises(ManifestError) as raised:
        parse_manifest(PROBE + f'{table}\nmetric = "passed"\n')

    [problem] = raised.value.problems
    assert (problem.table, problem.line) == ("(top level)", 6)
    assert problem.message.startswith("acceptance criteria do not live in infraops.toml")
    assert "the goal editor (/admin/infraops/goal/" in problem.message
