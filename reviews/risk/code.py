"""The analysis of code: Python, C, C++, CUDA and shaders. Signatures on the changed tokens
of each line, then the rules of its context (a kernel, a reduction, a critical section).

Contract: ``analyse_code(change, lexer, contexts, signatures, extra, moves)`` returns the
findings of one file of code, each with its order key, at most one per rule and line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import PurePosixPath

from reviews.risk import files
from reviews.risk.context import Context, c_contexts, python_contexts
from reviews.risk.diff import ADDED, CONTEXT, REMOVED, DiffLine, FileChange
from reviews.risk.lexers import Lexed, lex_python
from reviews.risk.lines import Changed, Contexts, Ordered, changed_lines, finding, overlaps
from reviews.risk.signatures import (
    ACCUMULATION,
    C_CONCURRENCY,
    C_SIGNATURES,
    CONCURRENCY,
    ENTRYPOINT,
    FAST_MATH,
    FAST_MATH_FLAGS,
    KERNEL,
    LAUNCH,
    LOCKS,
    NUMERICS,
    PRECISION,
    PRECISION_SWITCHES,
    PYTHON_CONCURRENCY,
    PYTHON_SERVING,
    PYTHON_SIGNATURES,
    PYTHON_THREAD_WORDS,
    SERVING,
    SERVING_ENV_NAME,
    STRONG_FLAG,
    SYNC,
    THREADS,
    TRITON_LAUNCH,
    Signature,
    SignatureSet,
)

_RAW_SIGNATURES = (FAST_MATH_FLAGS, PRECISION_SWITCHES)
PYTHON = SignatureSet((*PYTHON_SIGNATURES, *PYTHON_CONCURRENCY, PYTHON_THREAD_WORDS,
                        PYTHON_SERVING, *_RAW_SIGNATURES))
PYTHON_TRITON = SignatureSet((*PYTHON_SIGNATURES, *TRITON_LAUNCH, *PYTHON_CONCURRENCY,
                               PYTHON_SERVING, *_RAW_SIGNATURES))
NATIVE = SignatureSet((*C_SIGNATURES, *C_CONCURRENCY, *_RAW_SIGNATURES))
RAW = SignatureSet(_RAW_SIGNATURES)
_STRONG_FLAG = re.compile(STRONG_FLAG)
_ENTRYPOINT = re.compile(ENTRYPOINT)
_SERVING_ENV_NAME = re.compile(SERVING_ENV_NAME)
_DTYPE_LITERAL = re.compile(
    r"(?i)(?:float16|bfloat16|fp16|bf16|half|f16|float8\w*|fp8\w*|e4m3\w*|e5m2\w*|int8|int4|"
    r"uint8|fp4|nvfp4|mxfp4|mxfp8|w8a8|w4a16|awq|gptq|marlin|tf32|tf32x3|ieee|float32|fp32|"
    r"float64|fp64)")
_LOGGING = re.compile(r"\b(?:log|logger|logging|warn|warnings|print|raise|\w*Error|\w*Exception)"
                      r"\b|\.(?:info|debug|warning|error|exception|critical)\(")
# An exception handler's clause: which errors are caught, not what is computed.
_HANDLER = re.compile(r"^\s*(?:except\b|\}?\s*catch\s*\(|try\s*:|finally\s*:)")
_PRAGMA_UNROLL = re.compile(r"^\s*#\s*pragma\s+unroll\b|^\s*_Pragma\(\s*\"unroll")
# The diff shows the file is kernel code: Triton or TileLang calls, autotuning, warps.
TRITON_FILE = re.compile(r"\btl\.\w|\btriton\b|\btilelang\b|\bT\.Kernel\b|autotune|"
                          r"\bnum_warps\b|\bconstexpr\b")
# A call may name its template arguments first: `atomicLoad<int, scopeDevice>(&sem, order)`.
_CALL_OR_ASSIGN = re.compile(r"\w*\s*(?:<[\w\s,:*]*(?:<[\w\s,:*]*>[\w\s,:*]*)*>\s*)?"
                             r"(?:\(|(?::[^=\n]*)?=(?!=))")


class MoveIndex:
    """The changed lines of a whole diff, by their text without layout: lines removed from
    one file and added to another of the same language (or the reverse) were moved, not
    changed. Tests and docs are no destination (code moved from the library into a test is
    code the library lost)."""

    def __init__(self, changes: Sequence[FileChange]) -> None:
        self._paths: dict[tuple[str, str], set[str]] = {}
        for change in changes:
            if files.is_test(change.path) or files.is_docs(change.path):
                continue
            for hunk in change.hunks:
                for line in hunk.lines:
                    norm = _norm(line.text)
                    if line.kind != CONTEXT and norm:
                        self._paths.setdefault((line.kind, norm), set()).add(change.path)

    def elsewhere(self, path: str, line: DiffLine) -> set[str]:
        """The other files of the diff, in the same language, that have ``line``'s text on the
        opposite side."""
        other = ADDED if line.kind == REMOVED else REMOVED
        paths = self._paths.get((other, _norm(line.text)))
        if not paths:
            return set()
        suffix = _suffix(path)
        return {p for p in paths if p != path and _suffix(p) == suffix}

    def relocated(self, path: str, changed: Sequence[Changed]) -> set[tuple[int, int]]:
        """The lines of ``changed`` moved with a neighbour (blank lines aside) to one other
        file: a block of two lines or more, not one common line (`with self._lock:` here
        and there)."""
        out: set[tuple[int, int]] = set()
        for item in changed:
            here = self.elsewhere(path, item.line)
            if not here:
                continue
            lines = item.hunk.lines
            for step in (-1, 1):
                k = item.order[1] + step
                while 0 <= k < len(lines) and lines[k].kind == item.line.kind and (
                        not lines[k].text.strip()):
                    k += step
                if 0 <= k < len(lines) and lines[k].kind == item.line.kind and (
                        here & self.elsewhere(path, lines[k])):
                    out.add(item.order)
                    break
        return out


def _norm(text: str) -> str:
    return " ".join(text.split())


@lru_cache(maxsize=4096)
def _suffix(path: str) -> str:
    return PurePosixPath(path).suffix


def python_contexts_for(triton_file: bool) -> Contexts:
    """The Python context reader for one file (``triton_file``: the diff shows Triton)."""
    def contexts(texts: Sequence[str], lexed: Sequence[Lexed], section: str) -> list[Context]:
        return python_contexts(texts, lexed, section, triton_file=triton_file)
    return contexts


def c_contexts_for(device_file: bool, cuda_file: bool) -> Contexts:
    """The C/C++/CUDA context reader for one file (a shader language; a .cu/.cuh file)."""
    def contexts(texts: Sequence[str], lexed: Sequence[Lexed], section: str) -> list[Context]:
        return c_contexts(texts, lexed, section, device_file=device_file, cuda_file=cuda_file)
    return contexts


Extra = Callable[[Changed], Iterable[tuple[Signature, str]]]
Hits = dict[str, tuple[Signature, str]]  # rule -> (signature, the text it matched)


def analyse_code(change: FileChange, lexer: Callable[[Sequence[str]], list[Lexed]],
                 contexts: Contexts | None, signatures: SignatureSet | None,
                 extra: Extra | None, moves: MoveIndex | None = None,
                 seen: set[tuple[int, int]] | None = None) -> list[Ordered]:
    """The findings of one file of code (see the module docstring); ``signatures`` None: a
    build file, read for fast-math flags and precision switches only. ``seen`` gets the order
    of every line whose code tokens changed."""
    changed = changed_lines(change, lexer, contexts, signatures)
    if seen is not None:
        seen.update(item.order for item in changed if item.change.code)
    moved = _moved(changed)
    # Code moved here from another file of the diff (a module split) changes nothing.
    relocated = moves.relocated(change.path, changed) if moves is not None else set()
    wanted = [item for item in changed if item.order not in relocated and not item.is_import]
    # A line moved within the file is searched for flags and switches only (see _moved).
    searched = [item for item in wanted if signatures is not None and item.order not in moved]
    plain = [item for item in wanted if signatures is None or item.order in moved]
    found: dict[tuple[int, int], Hits] = {}
    for items, signature_set in ((searched, signatures), (plain, RAW)):
        if signature_set is not None and items:
            hits_of = signature_set.first_matches(
                [(item.lexed.code, item.lexed.raw, item.change.spans) for item in items],
                extend_match)
            found.update((item.order, hits) for item, hits in zip(items, hits_of, strict=True))
    per_line: list[tuple[Changed, Hits]] = []
    for item in wanted:
        hits = found[item.order]
        if item.context.kernel and not item.context.simd:
            hits.pop(THREADS, None)  # a kernel's "threads" are GPU lanes, not host threads
        if extra is not None:
            for signature, text in extra(item):  # a callable, not QuerySet.extra  # nosec B610
                hits.setdefault(signature.rule, (signature, text))
        if SYNC in hits and _only_getters(item.lexed.code, hits[SYNC][0]):
            del hits[SYNC]  # `get_fp32_allreduce()` reads a setting; it runs no collective
        if item.context.kernel and lexer is not lex_python and _exits_before_barrier(
                change, item):
            hits.setdefault(SYNC, (_EXIT_BEFORE_BARRIER, ""))
        _drop_weak(hits)
        if KERNEL in hits and only_stream_changed(item.lexed.code, item.change.spans):
            del hits[KERNEL]  # the launch's stream is ordering, not its grid
        per_line.append((item, hits))
    # A statement replaced by an atomic or a barrier is explained by its replacement: the
    # lines of a run that has a concurrency finding get no kernel or reduction context.
    runs = _runs(change)
    explained = {runs[item.order] for item, hits in per_line
                 if any(sig.category == CONCURRENCY for sig, _ in hits.values())}
    out: list[Ordered] = []
    for item, hits in per_line:
        _add_context_rules(item, hits, lexer is lex_python,
                           numerics=runs[item.order] not in explained)
        out.extend((item.order, finding(change, item, signature, text))
                   for signature, text in hits.values())
    return out


def _runs(change: FileChange) -> dict[tuple[int, int], tuple[int, int]]:
    """For each changed line, where its run of changed lines (no context between) starts."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for h, hunk in enumerate(change.hunks):
        start = 0
        for i, line in enumerate(hunk.lines):
            if line.kind == CONTEXT:
                start = i + 1
            else:
                out[(h, i)] = (h, start)
    return out


def python_extra(item: Changed) -> Iterable[tuple[Signature, str]]:
    """Findings from string literals: a dtype or precision named in a string ("bfloat16",
    "tf32x3"), a serving launch flag in a command list. Log messages do not count."""
    if not item.lexed.strings or _LOGGING.search(item.lexed.code):
        return
    for start, end in item.lexed.strings:
        value = item.lexed.raw[start:end].lstrip("rRbBuUfF").strip("\"'")
        # A launch command's flag names the line: ["--tp", "4"] -> ["--tp", "8"] changes it.
        if _STRONG_FLAG.search(value) or _ENTRYPOINT.search(value):
            yield _LITERAL_LAUNCH, value
        if not overlaps(item.change.spans, start, end):
            continue
        ordering = _GENERATED_SYNC.search(value)
        if ordering:  # device code a generator writes (NCCL's symmetric kernels)
            yield _LITERAL_SYNC, ordering.group()
        if _DTYPE_LITERAL.fullmatch(value):
            yield _LITERAL_PRECISION, value
        elif _SERVING_ENV_NAME.fullmatch(value):
            yield _LITERAL_ENV, value


_LITERAL_PRECISION = Signature(PRECISION, "", "names a numeric type or precision mode ({m}): "
                                              "a different precision")


# A barrier or fence in device code that Python writes out as text (a kernel generator).
_GENERATED_SYNC = re.compile(r"\b(?:__syncthreads|__syncwarp|__threadfence\w*|"
                             r"cudaGridDependencySynchronize|cudaTriggerProgrammaticLaunchCompletion"
                             r"|griddepcontrol\.\w+|mbarrier\.\w+|bar\.sync)\b")


_LITERAL_SYNC = Signature(SYNC, "", "writes a barrier or fence into generated device code ({m}): "
                                    "which threads and kernels wait for which")


# What code in a language no analyser reads (Rust, Go) says plainly (analysers._foreign).
FOREIGN = SignatureSet((
    Signature(THREADS, r"\b(?:std::)?thread::spawn\w*|\b(?:tokio::)?task::spawn\w*|"
              r"\btokio::spawn\b|\bspawn_blocking\b|\bSemaphore\b|\b\w*acquire_permit\b|"
              r"\btry_acquire\w*|\bacquire_owned\b|\bmpsc::\w*channel\b|\bMutex\b|"
              r"\bRwLock\b|\bCondvar\b|\bsync\.WaitGroup\b|\bnum_cpus::\w+|"
              r"\bavailable_parallelism\b|\b\w*_(?:threads|workers)\b|\bgo\s+func\b",
              "changes threads, tasks, permits or channels ({m}): what runs at once and what "
              "waits"),
    Signature(SERVING, r"\b\w*_(?:threads|workers)\b|#\[(?:clap|arg)\([^\]]*default_value\w*"
              r"(?:\s*=\s*(?:\"[^\"]*\"|[\w.:-]+))?",
              "changes a serving setting or a command-line default ({m}): how the service runs "
              "when started", extend=False),
    # Eighth round: GPU host code (candle's Metal backend): waits on queued work, command
    # buffers, locks; fast math; masks and causality; the environment a switch reads.
    Signature(SYNC, r"\b\w*(?:[Ww]ait_?[Uu]ntil|synchronize|flush_and_wait|_barrier|_fence|"
              r"[Cc]ommand_?[Bb]uffer|command_queue)\w*|\.(?:commit|wait|sync)\s*\(|"
              r"\b(?:encoder|blit)\.\w+\s*\(",
              "changes how host code waits on or queues GPU work ({m}): what a readback sees, "
              "which work it waits for"),
    Signature(LOCKS, r"\.(?:lock|try_lock|read|write)\s*\(\s*\)",
              "takes or releases a lock ({m}): what other threads see and wait for"),
    Signature(FAST_MATH, r"\b\w*(?:MathMode|FastMath|fast_math|MathFloatingPoint)\w*",
              "changes fast math ({m}): approximate transcendentals and reassociated sums"),
    Signature(ACCUMULATION, r"\b\w*(?:causal|softmax|_mask|mask_|logsumexp)\w*",
              "changes a mask, causality or a softmax ({m}): which scores count and how they "
              "are normalised"),
    Signature(PRECISION, r"\b\d+_?(?:u|i)(?:8|16|32|64|128|size)\b|"
              r"\bas\s+(?:u|i)(?:8|16|32|64|128|size)\b",
              "changes an integer's width ({m}): where an index, size or seed overflows or wraps",
              extend=False),
    Signature(LAUNCH, r"\b(?:std::)?env::var\w*\s*\(|\bos\.(?:Getenv|LookupEnv)\s*\(|"
              r"\b\w*(?:get_env|getenv|env_var)\w*\s*\(\s*\"",
              "reads an environment variable ({m}): a switch set where production is launched"),
    Signature(PRECISION, r"\bDType::\w+|\b(?:f16|bf16)\b|\bf(?:16|32|64)::(?:MIN|MAX|EPSILON|"
              r"NEG_INFINITY|INFINITY|MIN_POSITIVE)\b|\bto_dtype\b|-65504",
              "changes a dtype or a type's limit ({m}): the precision or range values are "
              "computed in", extend=False),
))


_LITERAL_LAUNCH = Signature(LAUNCH, "", "changes a serving launch command or flag ({m})")


_LITERAL_ENV = Signature(LAUNCH, "", "sets a serving environment variable ({m}): how the "
                                     "engine or its collectives run")


def only_stream_changed(code: str, spans: Sequence[tuple[int, int]]) -> bool:
    """Whether every changed span of a line lies in the stream argument of its kernel launch
    (the fourth of ``<<<grid, block, shared, stream>>>``, with a shared size of 0 the default):
    which stream the kernel joins, not its grid, block or shared memory."""
    start = code.find("<<<")
    end = code.find(">>>", start + 3)
    if start < 0 or end < 0 or not spans:
        return False
    depth, commas = 0, [start + 3]
    for i in range(start + 3, end):
        char = code[i]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            commas.append(i)
    if len(commas) != 4:
        return False
    # A shared-memory size of 0 written to reach the stream argument is the default.
    stream = commas[2] if code[commas[2] + 1:commas[3]].strip() == "0" else commas[3]
    return all(stream <= a and b <= end for a, b in spans)


# Eighth round: a getter or predicate named after a collective, called with no arguments
# (`get_fp32_allreduce()`, `use_fused_all_gather()`, `is_allreduce_enabled()`) reads a setting.
_GETTER = re.compile(r"\b(?:get|is|use|has|should|enable|enabled)_\w+\s*\(\s*\)|"
                     r"\b\w+_(?:enabled|disabled)\s*\(\s*\)")
_COLLECTIVE_REASON = "changes a collective or distributed step"


def _only_getters(code: str, signature: Signature) -> bool:
    """Whether a collective's finding rests on getters only: with every getter call taken out
    the line holds no collective's name any more."""
    if not signature.reason.startswith(_COLLECTIVE_REASON) or "_" not in code:
        return False
    collective = _compiled(signature.pattern)
    bare = _GETTER.sub(lambda m: " " if collective.search(m.group()) else m.group(), code)
    return bare != code and not collective.search(bare)


@lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


# Eighth round: an exit (`return;`, `if (i >= n) return;`) added, removed or moved in a kernel
# above a barrier or a block-wide reduction in the same hunk: the threads that leave never
# reach it, and the block deadlocks or reads what they did not write. A barrier may sit inside
# a helper (`BlockReduce`, `block_reduce_sum(v)`, `compute_max<..>(v, n)`).
_EXIT = re.compile(r"^\s*(?:\}\s*)?(?:(?:else\s+)?if\s*\(.*\)\s*\{?\s*)?return\b")
_BARRIER_AFTER = re.compile(r"__syncthreads|__syncwarp|\bbarrier\b|_barrier\s*\(|\bsync\w*\s*\(|"
                            r"\w*_sync\s*\(|\bbar\.sync\b|\w*[Bb]lock_?[Rr]educe\w*|"
                            r"\b[Bb]lock\w*(?:Sum|Max|Min|Reduce)\w*\s*[<(]|"
                            r"\b\w*(?:reduce|_max|_min|_sum)\w*\s*(?:<[^;()]*>)?\s*\(")
_EXIT_BEFORE_BARRIER = Signature(
    SYNC, "", "adds, removes or moves an exit above a barrier or a block-wide reduction: the "
              "threads that return never reach it, and the block deadlocks or reads values "
              "they did not write")


def _exits_before_barrier(change: FileChange, item: Changed) -> bool:
    if "return" not in item.lexed.code or not _EXIT.match(item.lexed.code):
        return False
    h, i = item.order
    for later in change.hunks[h].lines[i + 1:]:
        text = later.text.strip()
        if later.kind != REMOVED and text and not text.startswith(("//", "/*", "*")) and (
                _BARRIER_AFTER.search(text)):
            return True
    return False


# An assertion no release build runs (eighth round): a debug one (`assert(...)`,
# `DCHECK_LT(...)`, `TORCH_INTERNAL_ASSERT_DEBUG_ONLY(...)`) is compiled out under NDEBUG, so a
# width or cast inside it changes no value production computes; a compile-time one
# (`static_assert`, tenth round) is checked by the compiler, which emits nothing for it.
UNRUN_ASSERT = re.compile(r"^\s*(?:assert|static_assert|DCHECK\w*|\w*ASSERT\w*_DEBUG_ONLY|"
                          r"GGML_DEBUG_ASSERT|\w*_DASSERT)\s*\(")


def _drop_weak(hits: Hits) -> None:
    """A weak signature (an accumulator's name, a small constant) goes when another class
    explains the line: `atomicAdd(&sum, x)` is an atomic, `time.sleep(1e-3)` a wait."""
    categories = {sig.category for sig, _ in hits.values() if not sig.weak}
    for rule, (sig, _) in list(hits.items()):
        if sig.weak and categories - {sig.category}:
            del hits[rule]
    if CONCURRENCY in categories:
        hits.pop(ACCUMULATION, None)


def _add_context_rules(item: Changed, hits: Hits,
                       python: bool, *, numerics: bool = True) -> None:
    if not item.change.code or not item.lexed.has_code:
        return  # a comment, a docstring, a log message's text: no behaviour changed
    if _PRAGMA_UNROLL.match(item.lexed.code) or item.context.header:
        return  # a compiler hint; a signature (its parameters' changes show in the body)
    if _HANDLER.match(item.lexed.code):
        return  # which errors are caught (`except:` -> `except (ImportError, ...):`)
    if not python and UNRUN_ASSERT.match(item.lexed.code):
        return  # an assertion no release build runs: compiled out, or checked at compile time
    categories = {sig.category for sig, _ in hits.values()}
    context = item.context
    name = f"`{context.function}`" if context.function else "the function"
    if numerics and NUMERICS not in categories and CONCURRENCY not in categories:
        if context.kernel:
            kind = "Triton kernel" if python else "CPU (SIMD) kernel" if context.simd else (
                "GPU kernel")
            hits[KERNEL] = (Signature(KERNEL, "", f"changes code inside the {kind} {name}: "
                                      "its arithmetic, indexing or order of operations"), "")
        elif context.reduction:
            hits[ACCUMULATION] = (Signature(
                ACCUMULATION, "", f"changes code inside {name}, a reduction, norm, softmax or "
                                  "quantisation: its rounding and overflow behaviour"), "")
    if context.lock and LOCKS not in hits:
        hits[LOCKS] = (Signature(LOCKS, "", f"changes what runs while `{context.lock}` is held: "
                                            "the critical section"), "")


def _moved(changed: Sequence[Changed]) -> set[tuple[int, int]]:
    """Lines removed from one function and added, token for token, to another: code moved
    into a helper does not change what it does. A line moved within one function (a cast
    moved after an operation) or within kernels is a change."""
    by_side: dict[str, dict[str, set[str]]] = {ADDED: {}, REMOVED: {}}
    if len({item.line.kind for item in changed}) < 2:
        return set()  # only additions, or only deletions: nothing moved
    for item in changed:
        if item.change.norm.count(" ") >= 2:
            by_side[item.line.kind].setdefault(item.change.norm, set()).add(
                item.context.function)
    out: set[tuple[int, int]] = set()
    for item in changed:
        other = by_side[REMOVED if item.line.kind == ADDED else ADDED].get(item.change.norm)
        if other and item.context.function not in other and not item.context.kernel:
            out.add(item.order)
    return out


def extend_match(code: str, start: int, end: int) -> tuple[int, int]:
    """A name that is assigned or called covers its value or its arguments: `RELEASE_GIL =
    True` changes the GIL setting when only `True` changed; a call with template arguments
    (`atomicLoad<int, scopeDevice>(&sem, order) != old`) covers its arguments too."""
    if end and code[end - 1] == "(":  # the signature took the call's parenthesis
        opened = end
    else:
        match = _CALL_OR_ASSIGN.match(code, end)
        if match is None:
            return start, end
        opened = match.end() if match.group().endswith("(") else -1
        if opened < 0:
            return start, _value_end(code, match.end())
    depth, i = 1, opened
    while i < len(code) and depth:
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        i += 1
    return start, i


def _value_end(code: str, i: int) -> int:
    """Where the value of an assignment or keyword starting at ``i`` ends: a ',', ';' or an
    unmatched closing bracket."""
    depth = 0
    while i < len(code):
        ch = code[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif ch in ",;" and depth == 0:
            break
        i += 1
    return i
