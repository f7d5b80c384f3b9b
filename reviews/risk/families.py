"""Families of risky change the per-language analysers miss, and the fail-closed rule. Pure.

Issue 27 measured the analysers on diffs they had never seen: tile, block and split-K sizes
set at module level or in a launcher, loosened tolerances and changed seeds in tests, float
atomics, warp-shuffle masks and moved barriers, serving replicas in decorators, environment
variables set from Python and dtypes in config files went through with no finding. Each is a
*family* here (one pattern over the names such code uses, not one example), searched on the
changed lines with comments blanked and strings masked (``lexers``).

Contract: ``family_findings(change, language, found)`` returns the extra findings of one file
(order keys as ``analysers.analyse``), given the file's language and what the analysers
``found``. Test files get only the test families (a loosened tolerance, a changed seed). And
the classifier fails closed: in a file that holds kernels, launchers, a forward pass, serving
or deployment, a changed line whose numbers, dtypes, call arguments or environment values
differ, with no finding in the whole file, is ``unclassified``: a reviewer decides.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from reviews.risk import files
from reviews.risk.code import MoveIndex
from reviews.risk.diff import ADDED, CONTEXT, REMOVED, DiffLine, FileChange, Hunk
from reviews.risk.findings import MAX_TEXT, Finding
from reviews.risk.lexers import Lexed, lex_c, lex_python
from reviews.risk.lines import Ordered
from reviews.risk.signatures import (
    ACCUMULATION,
    ATOMICS,
    CONCURRENCY,
    DEPLOY,
    KERNEL,
    NUMERICS,
    PRECISION,
    PRODUCTION,
    SERVING,
    SYNC,
    THREADS,
    UNCLASSIFIED,
    UNSURE,
)

Order = tuple[int, int]

_NUMBER = re.compile(r"(?<![\w.])(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)"
                     r"[uUlLfF]*")
_TILE_NAME = (r"(?:\w*(?:BLOCK|TILE|SPLIT|SPLITS|CHUNK|WARPS|STAGES|TACTICS?|CONFIGS?)\w*|"
              r"\w*(?:block|tile|split|splits|chunk)_\w*|\w*_(?:block|tile|tiles|split|splits|chunk)|"
              r"num_warps|num_stages|num_ctas|B[TKVSMNDCH]|BLOCK|BS|NV|NK)")
_TILING = re.compile(rf"(?:^|[\s,(]){_TILE_NAME}\s*(?::\s*[\w.\[\], ]+)?=(?!=)|"
                     r"\btriton\.Config\(|\bfor\s+B[A-Z]?\s+in\s+\[")
_OPENS_TABLE = re.compile(rf"^\s*{_TILE_NAME}\s*(?::[^=]*)?=\s*[\[({{]\s*$")
_TOLERANCE = re.compile(r"(?i)\b(?:a?tol|rtol|atol|tolerance|eps|ratio|err_ratio|"
                        r"assert_close|allclose|assert_allclose|isclose|check_close)\b")
_SEED = re.compile(r"(?i)\b(?:\w*seed\w*|random_state)\b")
_FLOAT_ATOMIC = re.compile(r"\b(?:atomicAdd\w*|atomic_add|atomic_fetch_add|atomicAdd_system|"
                           r"index_add_?|scatter_add_?|scatter_reduce_?|index_put_)\b|"
                           r"\bred\.\w*\.?add\.f")
_WARP_SYNC = re.compile(r"\b(?:__shfl\w*|__ballot_sync|__any_sync|__all_sync|__activemask|"
                        r"__syncwarp|__syncthreads\w*|__threadfence\w*|memory_fence\w*|"
                        r"barrier_block|named_barrier\w*|mbarrier\w*|fence_\w+|"
                        r"debug_barrier|cp_async_wait\w*|\w*tma_store_wait\w*|\w*store_wait\w*|"
                        r"fence_view_async\w*|wait_group\w*)\b|\bbar(?:rier)?\.(?:sync|arrive)\b|"
                        r"\bfence\.\w+")
_ENV_SET = re.compile(r"\b(?:os\.environ\s*\[[^\]]*\]\s*=(?!=)|os\.environ\.(?:setdefault|"
                      r"update)\s*\(|os\.putenv\s*\(|(?:setenv|putenv)\s*\()")
_ENV_CONCURRENCY = re.compile(r"(?i)THREADS|CONNECTIONS|BLOCKING|ASYNC|STREAMS|WORKERS")
_REPLICAS = re.compile(r"\b(?:(?:num|min|max|initial)_replicas|replicas|(?:min|max)_containers|"
                       r"keep_warm|buffer_containers|scaledown_window|autoscaling_config|"
                       r"max_ongoing_requests|max_concurrent_queries|allow_concurrent_inputs|"
                       r"concurrency_limit|num_gpus)[\"']?\s*[=:]")
_DECORATOR = re.compile(r"^\s*@")
_DTYPE = re.compile(r"\b(?:torch|tl|np|numpy|jnp|cutlass|cute)\.(?:u?int\d+|float\d*\w*|bfloat16|"
                    r"half|double|e4m3\w*|e5m2\w*)\b|\bdtype\s*=|\.(?:half|float|double|"
                    r"bfloat16)\(\)|\.to\(\s*(?:torch|tl)\.")
_CONFIG_DTYPE = re.compile(r"(?i)(?:^|[\s\"'{,])[\w.-]*(?:dtype|precision|quant\w*|"
                           r"compute_type|amp|fp8|fp16|bf16|kv_cache_type)[\w.-]*[\"']?\s*[:=]")
_LOG_OR_RAISE = re.compile(r"^\s*(?:raise\b|print\(|\w*\.?(?:log|logger|logging|warn|warning|"
                           r"info|debug|error)\w*\(|warnings\.warn\()")
_CALL = re.compile(r"([\w.]+)\s*\([^)]")
_VALUE = re.compile(r"(?<![\w.])(?:[2-9]|\d\d+|\d*\.\d+)|\bdtype\b")
_TRAILING_COMMA = re.compile(r",([)\]}])")
_NAME = re.compile(r"[A-Za-z_]\w*")
_DEF = re.compile(r"^\s*(?:async\s+def|def|class|import|from|@)\b|^\s*@")
_INTEGER_INCREMENT = re.compile(r",\s*-?\d+\s*\)")
# A tile size computed rather than written (BK = triton.next_power_of_2(K)).
_SIZE_CALL = re.compile(r"\b(?:next_power_of_2|next_pow2|cdiv|ceil_div|min|max)\s*\(")
# Only a Triton program calls tl.*: a changed tl call is a kernel change wherever it sits.
_TRITON_CALL = re.compile(r"\btl\.\w+\s*\(")
# Seeding the generators (a seed call added or removed changes the numbers drawn).
_SEED_CALL = re.compile(r"\b(?:manual_seed(?:_all)?|set_seed|seed_everything|"
                        r"(?:np\.|numpy\.)?random\.seed|default_rng)\s*\(")
# The target of an assignment or a #define: `NAME = v`, `const int kName = v`, `#define NAME v`.
_TARGET = re.compile(r"^\s*#\s*define\s+(\w+)\s|^[^=(\[{]*?\b(\w+)\s*(?::[^=]*)?"
                     r"(?<![<>!=+\-*/%&|^])=(?!=)")
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
# Names of a number format: a quantisation scale, a width in bits, an epsilon, a clamp.
_FORMAT_WORDS = frozenset({"scale", "scales", "bits", "eps", "epsilon", "amax", "mantissa",
                           "exponent", "softcap", "clamp", "clip"})
# Names of how long a thread waits or polls before it gives up.
_WAIT_WORDS = frozenset({"timeout", "timeouts", "poll", "polls", "polling", "spin", "wait",
                         "waits", "deadline", "retries", "backoff", "heartbeat"})
# How many blocks run at once, which a grid-wide barrier or a persistent kernel relies on.
_RESIDENCY = re.compile(r"\b(?:num_sms|sm_count|num_sm|multiProcessorCount|\w*MultiCTA\w*|"
                        r"\w*multi_cta\w*|\w*[Cc]ooperative\w*|\w*max_active_blocks\w*|"
                        r"\w*OccupancyMaxActive\w*)\b")
# A guard on a program, lane or thread index: which of them write.
_GUARD = re.compile(r"^\s*(?:el(?:se\s+)?if|if)\b\s*\(?\s*(?:[\w.]*\b(?:i_[a-z]\w*|pid\w*|"
                    r"program_id\w*|lane(?:_id|_idx|Id|Idx)?|warp_(?:id|idx)|thread_?(?:id|idx)|"
                    r"tid|threadIdx\.[xyz]|blockIdx\.[xyz])\b|tl\.program_id\(|"
                    r"[\w:]*elect_one\w*\()")
_STORE = re.compile(r"\btl\.(?:store|atomic_\w+)\(|\b\w+\s*\[[^\]]*\]\s*=(?!=)|"
                    r"^\s*\*\s*\w+\s*=(?!=)|\b(?:st|red|atomic)_\w+\s*\(|\batomic\w*\(|"
                    r"\w+_store\w*\(")
# A warp shuffle whose lanes are summed rounds; one that takes a max, a min or a lane's value
# (a broadcast) does not: its mask, width and offsets are concurrency only.
_SHUFFLE = re.compile(r"__shfl\w*|__reduce_\w+_sync")
_SUMMED = re.compile(r"[-+*]=|[-+*]\s*__shfl|__shfl\w*\s*\([^;]*\)\s*[-+*]")
_LOOP_VAR = re.compile(r"^\s*for\s*\(\s*(?:[\w:]+\s+)*(\w+)\s*=")
# Build recipes (setup.py and the extension builders): what is linked, for which arch, under
# which build environment is what production runs, not a collective or a thread.
_BUILD_FILE = re.compile(r"\b(?:setuptools|CUDAExtension|CppExtension|BuildExtension|"
                         r"extra_link_args|extra_compile_args|cmdclass)\b")
_BUILD_LINE = re.compile(r"(?i)\b(?:extra_link_args|library_dirs|runtime_library_dirs|libraries|"
                         r"include_dirs|define_macros|\w*soname\w*|rpath|\w*_lib|lib\w+|\w*nccl\w*|"
                         r"\w*nvshmem\w*|os\.environ|os\.getenv|\w*arch_list\w*|gencode)\b|-l:|\.so\b")
# Where a changed number decides what runs or how it is computed: kernels, launchers, forward
# passes, serving and deployment (issue 27, "fail closed"). Known by the path's folders for
# kernels and deployment, by the lines for the rest: a `serving/` folder also holds plain
# Python (a request queue, a cost model) whose constants are nobody's numerics.
_RISKY_PATH = re.compile(r"(?i)(?:^|/)(?:ops|kernels?|csrc|cuda|triton|layers|models?|"
                         r"deploy\w*|launch\w*|comm|moe\w*|attention|gemm|jit)(?:/|\.|_|$)")
_RISKY_CODE = re.compile(r"@triton\.jit|\btl\.\w|__global__|__device__|\bdef\s+forward\b|"
                         r"<<<|\bT\.Kernel\b|\bcute\.\w|\btorch\.\w|asm\s+volatile|"
                         r"\b(?:uvicorn|serve|app|server)\.(?:run|start|deployment)\b|"
                         r"\bos\.environ\b")


@dataclass
class Families:
    """What the families found in one file, and which of the analysers' findings a family
    explains better: a concurrency change (a barrier, a shuffle's lanes, a guarded store) is
    not also a kernel's arithmetic, and a build recipe's library is not a collective."""

    findings: list[Ordered]
    explained: set[Order]  # lines whose kernel and accumulation findings a family replaces
    linked: set[Order]  # lines of a build recipe: what is linked, not what synchronises

    def supersedes(self, order: Order, finding: Finding) -> bool:
        """Whether the analysers' ``finding`` at ``order`` gives way to a family's."""
        return (order in self.explained and finding.rule in (KERNEL, ACCUMULATION)) or (
            order in self.linked and finding.category == CONCURRENCY)


def family_findings(change: FileChange, language: str | None, found: Sequence[Ordered],
                    moves: MoveIndex | None = None) -> Families:
    """The families' findings of one file and, when nothing at all was found in a file that
    runs kernels or serves, the fail-closed ``unclassified`` ones (see the module docstring)."""
    test = files.is_test(change.path)
    code = language in (files.PYTHON, files.CYTHON, files.NATIVE, files.SHADER)
    config = language in files.CONFIG_LANGUAGES
    families = Families([], set(), set())
    if not (code or config):
        return families
    python = language in (files.PYTHON, files.CYTHON)
    lexer = lex_python if python else lex_c
    out = families.findings
    unsure: list[Ordered] = []
    risky = not test and code and _holds_risky_code(change)
    build = python and not test and _is_build_recipe(change)
    # Where the analysers saw no kernel (its def out of the hunk's sight), a tl.* call says one.
    unseen_kernel = python and not any(f.category == NUMERICS for _, f in found)
    for h, hunk in enumerate(change.hunks):
        lines = list(_lines(hunk, lexer, config))
        if code and not test:
            out += [((h, i), _finding(change, hunk.lines[i], SYNC, CONCURRENCY,
                                      "moves code across a barrier: what the other threads "
                                      "see when they pass it"))
                    for i in _across_barrier(hunk)]
            for i, reason in _lanes_and_writers(lines):
                families.explained.add((h, i))
                out.append(((h, i), _finding(change, hunk.lines[i], SYNC, CONCURRENCY, reason)))
        for i, line in enumerate(lines):
            if line.kind == CONTEXT:
                continue
            order = (h, i)
            if test:
                hits = _test_hits(line)
            elif config:
                hits = _config_hits(line)
            else:
                hits = _code_hits(line, unseen_kernel)
                if order in families.explained:  # concurrency only, as the analysers'
                    hits = [hit for hit in hits if hit[1] != NUMERICS]
                if build and _BUILD_LINE.search(line.text) and not _untouched(line.code, line):
                    families.linked.add(order)
                    hits = [(DEPLOY, PRODUCTION, "changes a build recipe's libraries, link "
                             "arguments, architectures or build environment: the binary "
                             "production runs")] + [hit for hit in hits if hit[1] != CONCURRENCY]
            out += [(order, _finding(change, hunk.lines[i], rule, category, reason))
                    for rule, category, reason in hits]
            moved = moves is not None and moves.elsewhere(change.path, hunk.lines[i])
            if risky and not hits and not moved and _changes_a_value(line):
                unsure.append((order, _finding(
                    change, hunk.lines[i], UNSURE, UNCLASSIFIED,
                    "changes a number, dtype, call argument or environment value in code that "
                    "runs kernels or serves, and no rule knows it: a reviewer decides")))
    kept = [(order, f) for order, f in found if not families.supersedes(order, f)]
    if not kept and not out:
        families.findings = unsure
    return families


@dataclass(frozen=True)
class _Line:
    """One line of a hunk as the families read it."""

    kind: str
    text: str  # the raw line
    code: str  # comments blanked, strings masked (config files: the raw line)
    table: str  # the tile table (``BLOCKS = [``) the line sits in, "" if none
    twin: str | None  # the other side's line of the same shape, numbers aside
    kin: str | None  # the other side's line of the same form, numbers and names aside
    other: str  # every line of the other side, joined: what the change did not touch
    decorated: bool = False  # inside a decorator's call (``@serve.deployment(`` above)


def _lines(hunk: Hunk, lexer: Callable[[Sequence[str]], list[Lexed]],
           config: bool) -> Iterator[_Line]:
    """The hunk's lines with their counterparts on the other side (see ``_Line``)."""
    texts = [line.text for line in hunk.lines]
    masked = texts if config else [item.code for item in lexer(texts)]
    table = ""
    shapes: dict[str, dict[str, str]] = {ADDED: {}, REMOVED: {}}
    forms: dict[str, dict[str, str]] = {ADDED: {}, REMOVED: {}}
    sides: dict[str, list[str]] = {ADDED: [], REMOVED: []}
    for line, code in zip(hunk.lines, masked, strict=True):
        if line.kind != CONTEXT:
            shapes[line.kind].setdefault(_shape(code), code)
            forms[line.kind].setdefault(_form(code), code)
            sides[line.kind].append(" ".join(code.split()))
    joined = {kind: "\n".join(lines) + "\n" + _squash("".join(lines))
              for kind, lines in sides.items()}
    depth = 0  # open brackets of a decorator's call
    for line, code in zip(hunk.lines, masked, strict=True):
        decorated = depth > 0 or bool(_DECORATOR.match(code))
        if decorated:
            depth = max(0, depth + code.count("(") - code.count(")"))
        if _OPENS_TABLE.match(code):
            table = code
        elif code.strip()[:1] in ("]", ")", "}") and not code.startswith((" " * 8, "\t\t")):
            table = ""
        if line.kind == CONTEXT:
            yield _Line(line.kind, line.text, code, table, None, None, "", decorated)
            continue
        other = REMOVED if line.kind == ADDED else ADDED
        yield _Line(line.kind, line.text, code, table, shapes[other].get(_shape(code)),
                    forms[other].get(_form(code)), joined[other], decorated)


def _across_barrier(hunk: Hunk) -> list[int]:
    """The changed lines that moved from one side of an unchanged barrier to the other: the
    diff shows the statement moving, but what changed is the barrier's place."""
    lines = hunk.lines
    barriers = [k for k, line in enumerate(lines)
                if line.kind == CONTEXT and _WARP_SYNC.search(line.text)]
    out: list[int] = []
    for k in barriers:
        before = {" ".join(line.text.split()): line.kind for line in lines[:k]
                  if line.kind != CONTEXT}
        for i in range(k + 1, len(lines)):
            line = lines[i]
            kind = before.get(" ".join(line.text.split()))
            if line.kind != CONTEXT and kind is not None and kind != line.kind:
                out.append(i)
    return out


def _shape(code: str) -> str:
    return _NUMBER.sub("N", " ".join(code.split()))


def _form(code: str) -> str:
    """The line with names and numbers blanked: two lines of one form differ only in what
    they call things (a rename) or in their numbers."""
    return _NAME.sub("x", _shape(code))


def _new(pattern: re.Pattern[str], line: _Line) -> bool:
    """Whether the line has a match of ``pattern`` that the other side lacks: a match that
    only moved, or sits on a renamed or re-wrapped line, is no change."""
    return any(_untouched(m.group(), line) is False for m in pattern.finditer(line.code))


def _untouched(text: str, line: _Line) -> bool:
    """Whether ``text`` is on the other side too, whatever its layout (a re-wrapped call)."""
    return " ".join(text.split()) in line.other or _squash(text) in line.other


def _squash(text: str) -> str:
    """The text without layout: no whitespace, no trailing comma before a bracket."""
    return _TRAILING_COMMA.sub(r"\1", "".join(text.split()))


def _numbers_differ(line: _Line) -> bool:
    kin = line.twin if line.twin is not None else line.kin
    return kin is not None and _NUMBER.findall(kin) != _NUMBER.findall(line.code)


_Hit = tuple[str, str, str]


def _code_hits(line: _Line, unseen_kernel: bool = False) -> list[_Hit]:
    code, text = line.code, line.text
    hits: list[_Hit] = []
    tiling = (_TILING.search(code) or line.table) and not _untouched(code, line)
    renamed = line.kin is not None and not _numbers_differ(line)
    if renamed:
        tiling = False  # a rename
    if tiling and (_NUMBER.search(code + (line.twin or "")) or _SIZE_CALL.search(code)
                   or _new(_TILING, line)):
        hits.append((PRECISION, NUMERICS, "changes a tile, block, split or warp size: the "
                     "reduction order and so the rounding of the result"))
    if _new(_FLOAT_ATOMIC, line):
        if not _INTEGER_INCREMENT.search(code):
            hits.append((PRECISION, NUMERICS, "adds or removes an atomic accumulation: the "
                         "order of a float sum, and so its rounding, changes run to run"))
        hits.append((ATOMICS, CONCURRENCY, "changes an atomic accumulation: several threads "
                     "write the same address"))
    if _WARP_SYNC.search(code):  # a barrier that only moved is the change: no _new here
        hits.append((SYNC, CONCURRENCY, "changes a warp shuffle, barrier or fence: which "
                     "threads wait for which, and what they see"))
    if _ENV_SET.search(code) and not _untouched(code, line):
        hits.append((SERVING, PRODUCTION, "sets an environment variable from Python: how "
                     "NCCL, CUDA or the server behave in production"))
        if _ENV_CONCURRENCY.search(text):
            hits.append((THREADS, CONCURRENCY, "sets an environment variable that decides "
                         "threads, streams, connections or blocking"))
    if _REPLICAS.search(text) and (line.decorated or "deploy" in code) and (
            _numbers_differ(line) or _new(_REPLICAS, line)):
        hits.append((SERVING, PRODUCTION, "changes the replicas or containers that serve"))
    if _new(_DTYPE, line):
        hits.append((PRECISION, NUMERICS, "changes a dtype or a cast"))
    if (_SEED.search(code) and _numbers_differ(line)) or _new(_SEED_CALL, line):
        hits.append((PRECISION, NUMERICS, "changes a random seed"))
    if unseen_kernel and not renamed and _TRITON_CALL.search(code) and not _untouched(code,
                                                                                  line):
        hits.append((KERNEL, NUMERICS, "changes a Triton language call (tl.*), which only a "
                     "kernel makes: what the kernel loads, computes or stores"))
    words = _target_words(line)
    if words & _FORMAT_WORDS:
        hits.append((PRECISION, NUMERICS, "changes a scale, a width in bits, an epsilon or a "
                     "clamp: the number format a value is encoded or rounded in"))
    if words & _WAIT_WORDS:
        hits.append((THREADS, CONCURRENCY, "changes how long a thread or the host waits or "
                     "polls before it gives up"))
    if _new(_RESIDENCY, line) or (_RESIDENCY.search(_target(line) or "") and words):
        hits.append((SYNC, CONCURRENCY, "changes how many blocks run at once: a grid-wide "
                     "barrier or a persistent kernel needs all of its blocks resident"))
    return _distinct(hits)


def _target(line: _Line) -> str | None:
    match = _TARGET.match(line.code)
    return (match.group(1) or match.group(2)) if match else None


def _target_words(line: _Line) -> frozenset[str]:
    """The words of the name a changed line assigns or #defines, when its value changed (a
    new assignment with a number, or the other side assigns the name another value)."""
    name = _target(line)
    if name is None or _untouched(line.code, line):
        return frozenset()
    if line.kin is not None and not _numbers_differ(line):
        return frozenset()  # a rename
    value = line.code[line.code.index(name) + len(name):]
    there = re.search(rf"(?m)^.*\b{re.escape(name)}\b\s*(?::[^=\n]*)?=(?!=)(.*)$", line.other)
    if there is None and not _NUMBER.search(value):
        return frozenset()
    if there is not None and _NUMBER.findall(there.group(1)) == _NUMBER.findall(value):
        return frozenset()
    return frozenset(word.lower() for word in _WORDS.findall(name))


def _lanes_and_writers(lines: Sequence[_Line]) -> Iterator[tuple[int, str]]:
    """Concurrency that the analysers read as a kernel's arithmetic: a guard on a program,
    lane or thread index put on (or taken off) a store (which of them write one address), a
    warp shuffle that does not sum (its mask, width and the loop over its offsets decide which
    lanes meet, not how a sum rounds) and a barrier or wait moved or changed."""
    for i, line in enumerate(lines):
        if line.kind == CONTEXT or not line.code.strip() or _untouched(line.code, line):
            if line.kind != CONTEXT and _WARP_SYNC.search(line.code):
                yield i, "moves a barrier or a wait: what the threads see when they pass it"
            continue
        following = " ".join(later.code for later in lines[i + 1:i + 3])
        if _GUARD.match(line.code) and _STORE.search(following):
            yield i, ("guards a store by a program, lane or thread index: which of them "
                      "write one address, and whether they race")
        elif _SHUFFLE.search(line.code) and not _SUMMED.search(line.code):
            yield i, "changes which lanes a warp shuffle reaches (its mask, width or offsets)"
        elif _WARP_SYNC.search(line.code) and not _SHUFFLE.search(line.code):
            yield i, "changes a barrier, fence or wait between GPU threads"
        loop = _LOOP_VAR.match(line.code)
        if loop and any(_SHUFFLE.search(later.code) and not _SUMMED.search(later.code)
                        and re.search(rf"\b{loop.group(1)}\b", later.code)
                        for later in lines[i + 1:i + 3] if later.kind == line.kind):
            yield i, "changes the offsets a warp shuffle loops over: which lanes meet"


def _is_build_recipe(change: FileChange) -> bool:
    return change.path.rsplit("/", 1)[-1] == "setup.py" or any(
        _BUILD_FILE.search(line.text) for hunk in change.hunks for line in hunk.lines)


def _test_hits(line: _Line) -> list[_Hit]:
    """A test changes what passes: a tolerance loosened or a seed changed lets a numerics
    change through; a new test or a tighter tolerance does not."""
    hits: list[_Hit] = []
    if line.twin is not None and _TOLERANCE.search(line.code) and _loosened(line):
        hits.append((PRECISION, NUMERICS, "loosens a tolerance in a test: what used to fail "
                     "now passes"))
    if (_SEED.search(line.code) and _numbers_differ(line)) or _new(_SEED_CALL, line):
        hits.append((PRECISION, NUMERICS, "changes the seed a test compares results under"))
    return hits


def _config_hits(line: _Line) -> list[_Hit]:
    if not _CONFIG_DTYPE.search(line.text) or line.text.strip() in line.other:
        return []
    return [(PRECISION, NUMERICS, "changes a dtype or precision in a config file"),
            (SERVING, PRODUCTION, "changes the dtype or precision a deployment runs with")]


def _loosened(line: _Line) -> bool:
    """Whether the added side of the line allows more than the removed side: a larger number
    in the same place (the removed line of a loosening is flagged with it)."""
    here = [_value(m) for m in _NUMBER.findall(line.code)]
    there = [_value(m) for m in _NUMBER.findall(line.twin or "")]
    new, old = (here, there) if line.kind == ADDED else (there, here)
    return any(a > b for a, b in zip(new, old, strict=False))


def _value(text: str) -> float:
    try:
        return float(text.rstrip("uUlLfF")) if not text.lower().startswith("0x") else float(
            int(text, 16))
    except ValueError:
        return 0.0


def _changes_a_value(line: _Line) -> bool:
    """Whether a changed code line changes a number, a dtype or a call's arguments: a line
    whose change lies only in strings (log text), comments or names (a rename) does not, nor
    a line moved within the hunk."""
    code = line.code
    if not code.strip() or _LOG_OR_RAISE.match(code) or _DEF.match(code):
        return False
    if _untouched(code, line):
        return False
    if line.kin is not None:
        return _numbers_differ(line)
    return bool(_VALUE.search(code)) or any(
        f"{m.group(1)}(" in line.other for m in _CALL.finditer(code))  # other arguments


def _holds_risky_code(change: FileChange) -> bool:
    if _RISKY_PATH.search(change.path):
        return True
    return any(_RISKY_CODE.search(line.text) for hunk in change.hunks for line in hunk.lines
               ) or any(_RISKY_CODE.search(hunk.section) for hunk in change.hunks)


def _distinct(hits: list[_Hit]) -> list[_Hit]:
    """The first hit of each rule: a finding is one per rule and line."""
    return list({hit[0]: hit for hit in reversed(hits)}.values())[::-1]


def _finding(change: FileChange, line: DiffLine, rule: str, category: str,
             reason: str) -> Finding:
    return Finding(category, rule, reason, change.path, line.number, line.text[:MAX_TEXT],
                   line.kind, "")
