"""The tenth round's families (docs/risk.md, "The tenth round"): kinds of change the ninth
held-out set showed with no finding, or with only "unclassified", each read where it is
spelled the same in any repository.

- communicator groups: a collective group created, destroyed or named (``new_group``,
  ``init_collective_group``, ``init_process_group``, ``group_name=...``): which ranks meet in
  a collective, and whether two collectives share one; concurrency.
- waits on other workers: a remote result fetched or awaited (``ray.get``, ``ray.wait``,
  ``future.result()``), an event loop run, nested or replaced (``asyncio.run``,
  ``run_until_complete``, ``nest_asyncio``, ``new_event_loop``): who blocks on whom;
  concurrency.
- CPU placement: threads pinned to CPUs, cores, sockets or NUMA nodes (``affinity``,
  ``cpuset``, ``numa``, the machine's ``topology``, ``OMP_PROC_BIND``): which cores run the
  work and what they share; concurrency.
- parallel loops: a loop split into tasks for a pool (``ParallelFor``, ``parallel_for``,
  ``prange``, ``pool.map``, ``executor.submit``): how many tasks, and what each touches;
  concurrency.
- seeds passed: a ``seed=`` argument or keyword added, removed or changed (the families before
  read a seed's number and the calls that seed a generator): which random numbers a loader,
  sampler or initialiser draws; numerics.
- positional encodings: RoPE's base, scaling or rotary dimensions (``rope_theta``,
  ``rope_base``, ``rope_scaling``, ``inv_freq``, ``rotary_dim``): every position's angle;
  numerics.
- sampling parameters: temperature, top-k/p, min-p and the penalties set or changed in code or
  configuration (the sampler's own file was read before): which tokens come out; numerics.
- toolchain minimums: the versions a build requires of its tools and languages
  (``cmake_minimum_required``, ``python_requires``, ``requires-python``,
  ``CMAKE_CXX_STANDARD``, ``-std=c++17``): what production's build accepts; production.
- test bounds: in a test, a decimal number in an assertion changed (``ASSERT_INSIDE(k, 1.001,
  x, 1.3)`` -> ``1.4``, ``EXPECT_NEAR(a, b, 1e-3)``, ``self.assertLess(err, 0.05)``): what the
  test now lets pass; numerics (the families before read Python's named tolerances).
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from reviews.risk import files
from reviews.risk.diff import ADDED, CONTEXT, REMOVED, DiffLine, FileChange
from reviews.risk.lines import Ordered, line_finding
from reviews.risk.signatures import (
    CONCURRENCY,
    DEPLOY,
    LAUNCH,
    NUMERICS,
    PRECISION,
    PRODUCTION,
    SYNC,
    THREADS,
)
from reviews.risk.switches import LOG_CALL

_GROUP = re.compile(r"\b(?:new_group|new_subgroups\w*|init_collective_group|"
                    r"init_process_group|destroy_process_group|destroy_collective_group|"
                    r"create_collective_group|split_group|ProcessGroup\w*\s*\(|"
                    r"group_name\s*=)")
_REMOTE_WAIT = re.compile(r"\bray\.(?:get|wait)\s*\(|\.result\s*\(\s*(?:timeout\s*=[^)]*)?\)|"
                          r"\basyncio\.(?:run|wait_for|wait|gather|shield)\s*\(|"
                          r"\brun_until_complete\s*\(|\bnest_asyncio\b|"
                          r"\b(?:new|get|set)_event_loop\s*\(")
_PLACEMENT = re.compile(r"(?i)affinity|\bcpu_?set|\bnuma\w*|\btopology\b|OMP_PROC_BIND|"
                        r"OMP_PLACES|\btaskset\b|bind_?to_?core|\bpin_?(?:threads?|cpus?|"
                        r"cores?)\b|\bLpsToCpus\b|\bsockets?_?per\w*")
_PARALLEL_LOOP = re.compile(r"\bParallelFor\w*\s*\(|\bparallel_for\w*\s*\(|\bprange\s*\(|"
                            r"\bparallelize\s*\(|\bpool\.(?:i?map\w*|starmap\w*|apply_async)\s*\("
                            r"|\bexecutor\.(?:map|submit)\s*\(")
_SEED_ARGUMENT = re.compile(r"\b\w*seed\w*\s*=(?!=)")
_ROPE = re.compile(r"(?i)\brope_?(?:theta|base|scaling|type|factor|dim\w*|freq\w*)|"
                   r"\brotary_?(?:dim\w*|base|emb\w*_?base|pct|percentage)|\binv_freq\b|"
                   r"\brescale_factors\b|\bpartial_rotary_factor\b|\bmax_position_embeddings\b")
_SAMPLING = re.compile(r"(?i)(?<![\w.])(?:temperature|top_?k|top_?p|min_?p|typical_?p|"
                       r"repetition_?penalty|repeat_?penalty|presence_?penalty|"
                       r"frequency_?penalty)[\"']?\s*(?:=(?!=)\s*[\"']?[-+.\w]|"
                       r":(?!:)\s*[\"']?[-+.\d]|"  # a value, not a type hint's type
                       r":(?!:)[^=\n]{1,40}?=(?!=)\s*[\"']?[-+.\w])")  # a typed default
# A condition on a sampling parameter (``if temperature > 0.0 or top_p > 0.0``).
_SAMPLING_TEST = re.compile(r"(?i)^\s*(?:\}?\s*else\s+)?(?:if|elif|while)\b.*(?<!\w)(?:temperature|"
                            r"top_?k|top_?p|min_?p|typical_?p|do_sample|greedy)\b")
# A task's cancellation checked, requested or handled.
_CANCELLATION = re.compile(r"\bThrowIfCancellationRequested\b|\bCancellationToken\w*|"
                           r"\bIsCancellationRequested\b|\bctx\.Done\(\)|\.cancel\(\)|"
                           r"\bCancelledError\b|\bis_cancell?ed\(\)")
# Gradients' synchronisation across ranks switched or deferred (DDP's no_sync, bucketing).
_GRAD_SYNC = re.compile(r"\bno_sync\b|\brequire_(?:grad|backward)_sync\b|\bgrad_sync\b|"
                        r"\bsync_gradients\b|\bis_grad_enabled\(\)|\bbucket_cap_mb\b|"
                        r"\bfind_unused_parameters\b|\boverlap_(?:grad|comm|param)\w*")
# Arithmetic in Rust or Go (eleventh round, the tenth set): a math function or a tensor
# reduction or reshape called (`prob.ln()` for `prob.log(10.0)`, `math.Sqrt(...)`,
# `.topk_unsorted(...)`), or a float constant written.
_FOREIGN_MATH = re.compile(r"\.(?:ln|log|log2|log10|exp|exp2|sqrt|powf|powi|recip|tanh|"
                           r"sigmoid|softmax\w*|log_softmax|topk\w*|argmax|argmin|sum\w*|"
                           r"mean|reshape|broadcast_\w+|to_dtype|matmul)\s*\(|"
                           r"\bmath\.(?:Log\w*|Exp\w*|Sqrt|Pow\w*|Tanh|Max|Min|Round|Floor|"
                           r"Ceil)\s*\(|(?<![\w.])\d+\.\d+(?:[eE][-+]?\d+)?(?:_?f(?:32|64))?")
# Which platform or machine runs a path (eleventh round): an extension loaded on Linux only.
_PLATFORM = re.compile(r"\bplatform\.(?:system|machine|processor)\s*\(|\bsys\.platform\b|"
                       r"\bos\.name\b|\bIS_(?:WINDOWS|LINUX|MACOS|DARWIN)\b")
# The device a process binds before its communicators are made (set_device, device_id=).
_DEVICE_BINDING = re.compile(r"\bset_device\s*\(|\bdevice_id\s*=")
# How a distributed job's ranks meet: torchrun's rendezvous, standalone mode, the master's
# address, the node and process counts.
_RENDEZVOUS = re.compile(r"(?i)\brdzv\w*|\brendezvous\w*|\bstandalone\b|\bmaster_(?:addr|port)\b|"
                         r"\bnnodes\b|\bnproc_per_node\b")
# A flag or setting named for a collective or its overlap (XLA's
# `--xla_gpu_enable_pipelined_all_gather=true`, `async_all_reduce: true`): when the
# collectives run, combined and overlapped with what.
_COLLECTIVE_FLAG = re.compile(r"(?i)[\w-]*(?:collective|all_?reduce|all_?gather|reduce_?scatter|"
                              r"all_?to_?all|latency_hiding)[\w-]*[\"']?\s*(?:=(?!=)|:(?!:))"
                              r"\s*[\"']?[-+.\w]")
# A collective backend named: which library carries the collectives.
_BACKEND = re.compile(r"(?i)(?<![\w.-])(?:nccl|gloo|mpi|ucc|hccl|rccl|xccl|mscclpp)(?![\w.-])")
_TOOLCHAIN = re.compile(r"(?i)\bcmake_minimum_required\s*\(|\bcmake_policy\s*\(|"
                        r"\bpython_requires\b|\brequires-python\b|\bCMAKE_(?:CXX|CUDA|C)_STANDARD\b|"
                        r"-std=(?:c|gnu)\+\+\d+|\bcxx_std_\d+|\bmin(?:imum)?_?(?:gcc|clang|"
                        r"cuda|nvcc|python)_?version\b")
_TOOLCHAIN_FILE = re.compile(r"(?i)(?:^|/)(?:CMakeLists\.txt|[\w.-]+\.cmake|setup\.py|"
                             r"setup\.cfg|pyproject\.toml|Makefile|meson\.build|BUILD"
                             r"(?:\.bazel)?|[\w.-]+\.bzl)$")
_ASSERTION = re.compile(r"\b(?:ASSERT|EXPECT|CHECK|DCHECK|REQUIRE)_\w+\s*\(|\bassert\w*\b|"
                        r"\b(?:allclose|isclose|assert_close|approx)\s*\(")
_DECIMAL = re.compile(r"(?<![\w.])(?:\d+\.\d*|\.\d+|\d+(?:\.\d*)?[eE][-+]?\d+)(?![\w.])")
_NUMBER = re.compile(r"(?<![\w.])(?:\d+\.\d*|\.\d+|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)(?![\w.])")
# A log call, or a raise or throw: their arguments are a message.
_LOG = re.compile(LOG_CALL.pattern + r"|^\s*(?:raise|throw)\b")


def round_ten(change: FileChange, language: str | None) -> list[Ordered]:
    """The tenth round's findings of one file (see the module docstring): test bounds in
    tests; the rest in code, configuration and build files that are not tests."""
    if language in (None, files.DOCS, files.META):
        return []
    code = language in (files.NATIVE, files.PYTHON, files.CYTHON, files.SHADER)
    if files.is_test(change.path):
        return _test_bounds(change) if code else []
    settings = language in (*files.CONFIG_LANGUAGES, files.SHELL)
    foreign = language == files.FOREIGN
    toolchain = bool(_TOOLCHAIN_FILE.search(change.path))
    out: list[Ordered] = []
    for h, hunk in enumerate(change.hunks):
        candidates = [i for i, line in enumerate(hunk.lines)
                      if line.kind != CONTEXT and (foreign or _has_keyword(line.text))]
        if not candidates:  # most lines of the languages read in full: no family's word
            continue
        logged = _in_log_calls([line.text for line in hunk.lines])
        flat = {i: _flat(line.text) for i, line in enumerate(hunk.lines)
                if line.kind != CONTEXT}
        sides = {kind: " ".join(text for i, text in flat.items() if hunk.lines[i].kind == kind)
                 for kind in (ADDED, REMOVED)}
        for i in candidates:
            line = hunk.lines[i]
            if not flat[i] or i in logged or _COMMENT.match(flat[i]):
                continue
            other = sides[REMOVED if line.kind == ADDED else ADDED]
            hits = _hits(flat[i], other, code, settings, toolchain, foreign)
            if _option_default(hunk.lines, i, flat[i], other):
                hits.append((DEPLOY, PRODUCTION, "changes a command-line option's default: "
                             "what a job or server started without it runs with"))
            out += [((h, i), line_finding(change, line, rule, category, reason))
                    for rule, category, reason in hits]
    return out


_Hit = tuple[str, str, str]
# Words one of the families below needs, lower case (a cheap test before their patterns).
_KEYWORDS = ("group", "ray.", "result", "asyncio", "run_until", "event_loop", "affinity", "cpu",
             "numa", "topology", "omp_", "taskset", "core", "lpsto", "socket", "parallel",
             "prange", "pool.", "executor.", "seed", "rope", "rotary", "inv_freq", "rescale",
             "max_position", "temperature", "top", "min", "penalty", "typical", "greedy",
             "sample", "cancel", "sync", "grad_enabled", "bucket", "unused_param", "overlap_",
             "nccl", "gloo", "mpi", "ucc", "hccl", "xccl", "cmake", "requires", "standard",
             "std", "version", "platform", "os.name", "is_", "device", "rdzv", "rendezvous",
             "standalone", "master_", "nnodes", "nproc", "default", "all_", "reduce",
             "gather", "scatter", "latency_hiding", "collective")


def _has_keyword(text: str) -> bool:
    low = text.lower()
    return any(word in low for word in _KEYWORDS)
# A comment line (a C preprocessor line other than #define is read as one; "--flag" is not).
_COMMENT = re.compile(r"#(?!\s*define\b)|//|/?\*|--(?:\s|$)")
_FAMILIES: tuple[tuple[re.Pattern[str], str, str, str, str], ...] = (
    # pattern, where it is read (code; settings: code in any language or a configuration or
    # shell file; launch: a configuration or shell file only; toolchain: a build file; any:
    # code in any language; foreign: Rust, Go and the others read in part), rule, category,
    # reason
    (_TOOLCHAIN, "toolchain", DEPLOY, PRODUCTION, "changes the version a build requires of its "
     "tools or language: what production's build accepts and how it compiles"),
    (_ROPE, "settings", PRECISION, NUMERICS, "changes a positional encoding's parameters (RoPE "
     "base, scaling, rotary dimensions): every position's angle"),
    (_SAMPLING, "settings", PRECISION, NUMERICS, "changes a sampling parameter (temperature, "
     "top-k/p, a penalty): which tokens come out"),
    (_GROUP, "code", SYNC, CONCURRENCY, "creates, destroys or names a communicator group: which "
     "ranks meet in a collective, and whether two collectives share one"),
    (_REMOTE_WAIT, "code", THREADS, CONCURRENCY, "waits on another worker's result or runs an "
     "event loop (ray.get, future.result, asyncio.run, nest_asyncio): who blocks on whom"),
    (_PLACEMENT, "code", THREADS, CONCURRENCY, "changes which CPUs, cores, sockets or NUMA "
     "nodes the threads run on: what they share and how fast they meet"),
    (_PARALLEL_LOOP, "code", THREADS, CONCURRENCY, "changes a parallel loop (its tasks, their "
     "count or their body's split): what each task touches, and who runs at once"),
    (_SEED_ARGUMENT, "code", PRECISION, NUMERICS, "passes, drops or changes a seed: which "
     "random numbers a loader, sampler or initialiser draws"),
    (_SAMPLING_TEST, "code", PRECISION, NUMERICS, "changes a condition on a sampling parameter "
     "(temperature, top-k/p): when the sampler draws and when it takes the greedy token"),
    (_CANCELLATION, "any", THREADS, CONCURRENCY, "checks, requests or handles a task's "
     "cancellation: where a running task stops, and what it leaves half done"),
    (_GRAD_SYNC, "code", SYNC, CONCURRENCY, "switches, defers or buckets the gradients' "
     "synchronisation across ranks: when the all-reduce runs and what it sums"),
    (_FOREIGN_MATH, "foreign", PRECISION, NUMERICS, "changes arithmetic in a language the "
     "classifier reads only in part (a math function, a reduction, a reshape, a float "
     "constant): the numbers it computes"),
    (_PLATFORM, "code", DEPLOY, PRODUCTION, "changes which platform or machine runs a code "
     "path (an extension loaded, a kernel built): what production runs where"),
    (_DEVICE_BINDING, "code", SYNC, CONCURRENCY, "changes the device a process binds before "
     "its communicators are made: which GPU each rank's collectives run on"),
    (_RENDEZVOUS, "code", SYNC, CONCURRENCY, "changes how a distributed job's ranks meet "
     "(rendezvous, standalone mode, the master's address, node and process counts)"),
    (_RENDEZVOUS, "code", LAUNCH, PRODUCTION, "changes how a distributed job is launched: "
     "what production runs"),
    (_COLLECTIVE_FLAG, "launch", SYNC, CONCURRENCY, "changes a setting named for a "
     "collective (pipelining, combining, overlapping all-reduce, all-gather, reduce-scatter): "
     "when the collectives run and what they overlap"),
    (_BACKEND, "launch", SYNC, CONCURRENCY, "changes the collective backend (NCCL, Gloo, "
     "MPI, ...): which library carries the collectives, and how they wait"),
    (_BACKEND, "launch", DEPLOY, PRODUCTION, "changes the collective backend a job is launched "
     "with: what production runs on"),
)
# What stands between a setting's name and its value (CMake's set(NAME value) included).
_SEPARATOR = " \t=:(\"'"
# A value ends where a list, call, statement or string does.
_VALUE_END = re.compile(r"[\s,;)\]}\"']")
# Setting an environment variable: read by the environment families, as production.
_SETS_ENVIRONMENT = re.compile(r"\benviron\b|env\[|\bsetenv\b|\bputenv\b|^\s*export\s")


def _hits(text: str, other: str, code: bool, settings: bool, toolchain: bool,
          foreign: bool) -> list[_Hit]:
    """The families whose pattern matches ``text`` (a changed line, flattened) where what it
    matches, with the value that follows, is not on the hunk's other side (``other``): a
    flag list that gained ``-ffast-math`` beside an unchanged ``-std=c++17`` is not a
    toolchain change."""
    where = {"code": code, "settings": code or settings or foreign, "toolchain": toolchain,
             "any": code or foreign, "launch": settings, "foreign": foreign}
    hits: list[_Hit] = []
    for pattern, read, rule, category, reason in _FAMILIES:
        if not where[read]:
            continue
        if pattern in (_PLACEMENT, _RENDEZVOUS) and _SETS_ENVIRONMENT.search(text):
            continue  # an environment variable set: production, read by the env families
        # A call's window is the rest of its line (an argument changed); a setting's, its value.
        if any(_new_here(text, m, other, m.group().endswith("(") or pattern is _SAMPLING_TEST)
               for m in pattern.finditer(text)):
            hits.append((rule, category, reason))
    return hits


def _new_here(text: str, m: re.Match[str], other: str, whole_line: bool) -> bool:
    """Whether what ``m`` matched in ``text``, with the value after it (or the rest of the
    line), is not on the hunk's other side."""
    end = len(text)
    if not whole_line:
        value = m.end() + len(text[m.end():]) - len(text[m.end():].lstrip(_SEPARATOR))
        stop = _VALUE_END.search(text, value)
        end = stop.start() if stop else end
    return text[m.start():end] not in other


# A command-line option declared (argparse, click, typer, absl) and a default given to it.
_OPTION_CALL = re.compile(r"\badd_argument\s*\(|\badd_option\s*\(|@click\.option\s*\(|"
                          r"\btyper\.Option\s*\(|\bflags\.DEFINE_\w+\s*\(|"
                          r"^\s*[\"']--[\w-]+[\"'],")  # an option's name, its call above the hunk
_DEFAULT = re.compile(r"\bdefault\s*=(?!=)")


def _option_default(lines: Sequence[DiffLine], i: int, text: str, other: str) -> bool:
    """Whether line ``i`` (``text``, flattened) gives a command-line option's call (on the
    line or one of the ten before it, within the hunk) a default the other side does not."""
    m = _DEFAULT.search(text)
    if m is None or not any(_OPTION_CALL.search(lines[j].text)
                            for j in range(max(0, i - 10), i + 1)):
        return False
    return _new_here(text, m, other, whole_line=False)


def _flat(text: str) -> str:
    """A line without the spaces around ``=`` and ``:`` (``seed = 1`` reads as ``seed=1``)."""
    return re.sub(r"\s*([=:])\s*", r"\1", text.strip())


def _in_log_calls(texts: list[str]) -> set[int]:
    """The lines of a hunk that a log or print call's arguments run over (the call's first
    line included): their values are what a reader sees."""
    inside: set[int] = set()
    depth = 0
    for i, text in enumerate(texts):
        if depth > 0 or _LOG.search(text):
            inside.add(i)
            depth = max(0, depth + text.count("(") - text.count(")"))
    return inside


def _test_bounds(change: FileChange) -> list[Ordered]:
    """The assertion lines of a test's hunks (those with a decimal number) that let more
    pass than the line they replace (paired in order within the hunk), and those dropped
    with a number the hunk's new side does not assert: a tightened bound is not a risk."""
    out: list[Ordered] = []
    for h, hunk in enumerate(change.hunks):
        numbers: dict[str, Counter[str]] = {ADDED: Counter(), REMOVED: Counter()}
        asserting: list[tuple[int, list[str], bool]] = []  # line, its numbers, any decimal
        for i, line in enumerate(hunk.lines):
            if line.kind == CONTEXT or not _ASSERTION.search(line.text):
                continue
            code = line.text.split("#")[0]
            found = [repr(float(n)) for n in _NUMBER.findall(code)]
            decimal = bool(_DECIMAL.search(code))
            if decimal:
                numbers[line.kind].update(found)
            asserting.append((i, found, decimal))
        removed = [a for a in asserting if hunk.lines[a[0]].kind == REMOVED]
        added = [a for a in asserting if hunk.lines[a[0]].kind == ADDED]
        for (old_i, old, old_decimal), (new_i, new, new_decimal) in zip(removed, added,
                                                                       strict=False):
            if (old_decimal or new_decimal) and _loosened(
                    old, new, _LOWER_BOUND.search(hunk.lines[new_i].text) is not None):
                out += [((h, i), line_finding(change, hunk.lines[i], PRECISION, NUMERICS,
                                              "loosens a numeric bound a test asserts: what "
                                              "the test now lets pass"))
                        for i in (old_i, new_i)]
        for i, found, decimal in removed[len(added):]:  # an assertion on a number dropped
            if decimal and any(number not in numbers[ADDED] for number in found):
                out.append(((h, i), line_finding(
                    change, hunk.lines[i], PRECISION, NUMERICS, "drops an assertion on a "
                    "numeric bound: what the test now lets pass")))
    return out


# An assertion whose number is a floor (accuracy >= 0.9): lowering it loosens the test.
_LOWER_BOUND = re.compile(r"(?i)greater|>=?|\b(?:GE|GT)\b|_GE\b|_GT\b|\bmin")


def _loosened(old: list[str], new: list[str], floor: bool) -> bool:
    """Whether the new numbers let more pass than the old, position by position: a ceiling
    raised, a floor lowered, or a number gone; a bound only tightened (or unchanged) is not."""
    if len(new) < len(old):
        return True
    for before, after in zip(old, new, strict=False):
        a, b = float(before), float(after)
        if (b < a) if floor else (b > a):
            return True
    return False
