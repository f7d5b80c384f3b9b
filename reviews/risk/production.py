"""The production analysis: deployment files, launch scripts and build recipes, serving
configuration. A deployment file is production on every changed line; elsewhere the line
must name a serving setting, a launch flag or an entrypoint.

Contract: ``deployment(change, kind)``, ``shell(change)``, ``config(change, language)`` and
``install_pins(change)`` return the findings of one file, each with its order key.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from reviews.risk import files
from reviews.risk.code import RAW
from reviews.risk.config import key_paths, normal_key
from reviews.risk.diff import ADDED, CONTEXT, REMOVED, FileChange
from reviews.risk.environment import docker_normal, draws_or_rounds, runtime_changes
from reviews.risk.lexers import Lexed, lex_hash, lex_json
from reviews.risk.lines import Changed, Ordered, changed_lines, finding, line_finding, overlaps
from reviews.risk.signatures import (
    DEPLOY,
    ENTRYPOINT,
    FAST_MATH_FLAGS,
    GPU_ARCH,
    LAUNCH,
    NUMERIC_KEY,
    PRECISION,
    PRODUCTION,
    SERVING,
    SERVING_ENV,
    SERVING_KEY,
    STRONG_FLAG,
    THREADS,
    Signature,
)

_STRONG_FLAG = re.compile(STRONG_FLAG)
_GPU_ARCH = re.compile(GPU_ARCH)
_ENTRYPOINT = re.compile(ENTRYPOINT)
_SERVING_ENV = re.compile(SERVING_ENV)
# A package manager's install command (`pip install`, `uv add`, `apt-get install`, ...): never a
# service's entrypoint; its packages and pins are what CI or an image installs.
_INSTALL = re.compile(r"\b(?:pip3?|uv\s+pip|uv|conda|mamba|micromamba|poetry|apt-get|apt|yum|dnf|"
                      r"apk|brew|npm|cargo|gem)\s+(?:install|add)\b")
_ANY_FLAG = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*|(?<![\w-])[A-Za-z_]\w*=")
# A line of a script that is a command's long option (a continuation of a launch, or a line of
# a MODEL_OPTIONS="..." string the script expands into one): how the program it starts runs.
# A build file's compiler flags: CMake's flag variables and options, make's FLAGS variables.
_COMPILER_FLAGS = re.compile(r"\b(?:CMAKE_\w*_FLAGS\w*|\w*NVCC_?FLAGS\w*|(?:C|CXX|CU|LD)FLAGS|"
                             r"(?:target|add)_compile_options|(?:target|add)_link_options)\b")
# A build file's linking: the libraries and include directories the binary is built against
# (`target_link_libraries(... -lnccl)` -> `${NCCL_LIBRARIES}`, `find_package(NCCL)`).
_LINKED = re.compile(r"\b(?:target_link_libraries|link_libraries|target_link_directories|"
                     r"link_directories|target_include_directories|include_directories|"
                     r"find_package|find_library|find_path|LINK_LIBRARIES|LDLIBS|LIBS)\b|"
                     r"\b\w+_(?:LIBRARY|LIBRARIES|LIBS|INCLUDE_DIRS?|LIB_DIRS?)\b|"
                     r"(?<![\w-])-l(?!ineinfo)[A-Za-z][\w+:.-]*|(?<![\w-])-L\S+|"
                     r"\.(?:so|a|lib|dylib)\b")
_FAST_MATH = re.compile(FAST_MATH_FLAGS.pattern)
# Eighth round: an instruction-set flag (`-mfma`, `-mavx512f`, `-march=native`, `/arch:AVX2`):
# which instructions the binary holds and which machines run it (production); `-mfma` lets
# the compiler fuse multiplies and adds as well (numerics, read as a fast-math flag).
_ISA_FLAG = re.compile(r"(?<![\w-])(?:-m(?:no-)?(?:fma4?|avx\w*|sse\d\w*|f16c|bmi2?|amx\w*)"
                       r"(?![\w-])|-m(?:arch|cpu|tune)=\S+|/arch:\w+)")
# Eighth round: a macro defined for the compiler (`-DDISABLE_AGGRESSIVE_ATOMIC`,
# `add_compile_definitions(USE_SPIN_LOCK)`) whose name says atomics, fences, locks, barriers,
# threads or ordering switches how the compiled code synchronises: concurrency.
_SYNC_DEFINE = re.compile(r"(?:(?<![\w-])-D|\bcompile_definitions\s*\([^)]*?\b)"
                          r"([A-Z0-9_]*(?:ATOMIC|ATOMICS|FENCE|FENCES|SYNC|LOCK|LOCKS|LOCKFREE|"
                          r"MUTEX|THREAD|THREADS|THREADING|BARRIER|BARRIERS|ORDER|ORDERING)"
                          r"(?:_[A-Z0-9_]*)?)\b")
_OPTION_LINE = re.compile(r"^\s*--[A-Za-z][\w-]*(?:[=\s]|$)")


def deployment(change: FileChange, kind: str) -> list[Ordered]:
    """Every changed line of a deployment file that is not a comment or blank: ``kind``
    names the artefact (a Dockerfile, a CI workflow, ...). Fast-math flags and precision
    switches there are numerics as well, variables of collectives and threading runtimes
    concurrency. A Dockerfile line only spelled anew (``ENV K V`` -> ``ENV K=V``) sets what it
    set: no change."""
    out: list[Ordered] = []
    dockerfile = files.language(change.path) == files.DOCKERFILE
    sides = _other_sides(change)
    for item in changed_lines(change, lex_hash, None, None):
        raw = item.lexed.raw
        if not raw.strip():
            continue
        other = sides[item.order[0]][REMOVED if item.line.kind == ADDED else ADDED]
        if dockerfile and raw.strip() not in other and _respelled(raw, other):
            continue
        reason = f"changes {kind}"
        out.append((item.order, finding(change, item, Signature(DEPLOY, "", reason), "")))
        out += _runtime_environment(change, item, other)
        for signature, start, end, text in RAW.matches(raw):
            if overlaps(item.change.spans, start, end):
                out.append((item.order, finding(change, item, signature, text)))
                break
    return out


def _other_sides(change: FileChange) -> list[dict[str, str]]:
    """For each hunk, each side's changed lines joined, comments blanked (what the other side
    of a line is: a variable commented out is not set)."""
    return [{kind: "\n".join(lexed.raw for lexed in lex_hash(
        [line.text for line in hunk.lines if line.kind == kind]))
             for kind in (ADDED, REMOVED)} for hunk in change.hunks]


_FLAGS_REASON = "changes the compiler's flags"


def _only_fast_math(raw: str, other: str) -> bool:
    """Whether the line is a line of the other side but for a fast-math flag."""
    normal = "".join(_FAST_MATH.sub(" ", raw).split())
    return any("".join(_FAST_MATH.sub(" ", line).split()) == normal
               for line in other.splitlines())


def _respelled(raw: str, other: str) -> bool:
    normal = docker_normal(raw)
    return any(docker_normal(line) == normal for line in other.splitlines())


def _runtime_environment(change: FileChange, item: Changed, other: str) -> list[Ordered]:
    """Concurrency for a changed line that sets (or drops) a variable of a collective or a
    threading runtime, or preloads another threading runtime; numerics for one that decides
    the random numbers drawn or determinism (see ``environment``)."""
    out: list[Ordered] = []
    names = runtime_changes(item.lexed.raw, other)
    if names:
        signature = Signature(THREADS, "", f"sets or drops {', '.join(names)}: a variable of a "
                                           "collective or threading runtime, how ranks and "
                                           "threads wait and meet")
        out.append((item.order, finding(change, item, signature, "")))
    draws = runtime_changes(item.lexed.raw, other, draws_or_rounds)
    if draws:
        signature = Signature(PRECISION, "", f"sets or drops {', '.join(draws)}: a seed, a "
                                             "random generator's rounds or determinism, the "
                                             "numbers drawn and summed")
        out.append((item.order, finding(change, item, signature, "")))
    return out


def shell(change: FileChange) -> list[Ordered]:
    """Shell scripts and build files: launch commands, serving flags and environment
    variables, every code line of a script named as a launcher; fast-math flags."""
    launch_script = files.is_launch_script(change.path) or files.is_serving_path(change.path)
    build = files.language(change.path) == files.BUILD
    out: list[Ordered] = []
    entrypoints: dict[int, str] = {}
    for h, hunk in enumerate(change.hunks):
        for line in hunk.lines:
            found = _entrypoint(line.text)
            if found:
                entrypoints.setdefault(h, found)
    sides = _other_sides(change)
    for item in changed_lines(change, lex_hash, None, None):
        raw = item.lexed.raw
        if not raw.strip():
            continue
        out += _runtime_environment(
            change, item, sides[item.order[0]][REMOVED if item.line.kind == ADDED else ADDED])
        other = sides[item.order[0]][REMOVED if item.line.kind == ADDED else ADDED]
        reason = _launch_reason(raw, launch_script, entrypoints.get(item.order[0]), build)
        define = _SYNC_DEFINE.search(raw)
        if define and overlaps(item.change.spans, *define.span(1)):
            out.append((item.order, finding(change, item, Signature(
                THREADS, "", f"defines {define.group(1)} for the compiler: a macro that "
                             "switches how the compiled code synchronises (atomics, fences, "
                             "locks or threads)"), "")))
        if reason.startswith(_FLAGS_REASON) and _only_fast_math(raw, other):
            reason = ""  # the flags differ by a fast-math one: numerics, read below
        if reason:
            signature = Signature(LAUNCH, "", reason)
            out.append((item.order, finding(change, item, signature, "")))
        for signature, start, end, text in RAW.matches(raw):
            if overlaps(item.change.spans, start, end):
                out.append((item.order, finding(change, item, signature, text)))
                break
    pinned = {order for order, _ in out}
    return out + [(order, f) for order, f in install_pins(change) if order not in pinned]


def install_pins(change: FileChange) -> list[Ordered]:
    """A script's install commands (seventh round): a changed ``pip install`` (``conda``,
    ``apt-get``, ``uv add``, ...) line, or a line its backslash continues, that the other side
    of the hunk does not hold as it is: which packages and versions CI or an image installs (a
    pin added, moved or dropped: ``torch==2.11.0`` -> ``torch``). A test script's too: it pins
    what CI verifies production against."""
    out: list[Ordered] = []
    for h, hunk in enumerate(change.hunks):
        if not any("install" in line.text or " add " in line.text for line in hunk.lines):
            continue
        lexed = lex_hash([line.text for line in hunk.lines])
        sides = {kind: {" ".join(lexed[i].raw.split()) for i, line in enumerate(hunk.lines)
                        if line.kind == kind} for kind in (ADDED, REMOVED)}
        for kind in (ADDED, REMOVED):
            continued = False
            for i, line in enumerate(hunk.lines):
                if line.kind not in (CONTEXT, kind):
                    continue
                raw = lexed[i].raw
                install = continued or bool(_INSTALL.search(raw))
                continued = install and raw.rstrip().endswith("\\")
                other = sides[REMOVED if kind == ADDED else ADDED]
                if install and line.kind == kind and raw.strip() and (
                        " ".join(raw.split()) not in other):
                    out.append(((h, i), line_finding(
                        change, line, DEPLOY, PRODUCTION, "changes an install command's "
                        "packages or pins (a version added, moved or dropped): what CI or an "
                        "image installs, and so what production is built and verified with")))
    return out


def _entrypoint(text: str) -> str:
    if _INSTALL.search(text):
        return ""
    match = _ENTRYPOINT.search(text)
    return " ".join(match.group().split()) if match else ""


def _launch_reason(raw: str, launch_script: bool, entrypoint: str | None,
                   build: bool = False) -> str:
    """Why a changed script line is production, "" if it is not: it runs an entrypoint, sets
    a serving flag or variable, is a flag of a launch command the hunk shows or a script's
    option line, or belongs to a launch script (``build``: a build file, whose option lines
    are a compiler's)."""
    own = _entrypoint(raw)
    if own:
        return f"changes how the service is launched or deployed ({own})"
    strong = _STRONG_FLAG.search(raw)
    if strong:
        return f"changes a serving launch flag ({strong.group().strip()}): parallelism, batch " \
               "and memory limits of production"
    env = _SERVING_ENV.search(raw)
    if env:
        return f"changes a serving environment variable ({env.group().rstrip('= ')})"
    arch = _GPU_ARCH.search(raw)
    if arch:
        return f"changes the GPU architectures a build compiles for ({arch.group()})"
    isa = _ISA_FLAG.search(raw) if build else None
    if isa and not _FAST_MATH.search(_ISA_FLAG.sub(" ", raw)):
        return f"changes the instruction set a build targets ({isa.group()}): the " \
               "instructions of the binary production runs and the machines that can run it"
    # A fast-math flag is numerics only (the RAW signatures read it).
    flags = _COMPILER_FLAGS.search(raw) if build and not _FAST_MATH.search(raw) else None
    if flags:
        return f"{_FLAGS_REASON} ({flags.group()}): the binary production runs"
    linked = _LINKED.search(raw) if build and not _COMPILER_FLAGS.search(raw) else None
    if linked:
        return f"changes what the build links or includes ({linked.group()}): the binary " \
               "production runs"
    if entrypoint and _ANY_FLAG.search(raw):
        return f"changes a flag of the {entrypoint} launch command"
    if _OPTION_LINE.match(raw) and not build:
        return "changes an option a script passes to the program it starts (a line of its " \
               "command or of an options string): how that program runs"
    if launch_script:
        return "changes a launch script: how production starts the service"
    return ""


def config(change: FileChange, language: str) -> list[Ordered]:
    """Configuration files: serving keys (or every key of a file whose path says it
    configures serving, and of .env files), precision keys, launch flags in values. Tooling
    configuration has no serving keys."""
    lexer = {files.CONFIG_JSON: lex_json, files.CONFIG_INI: _lex_ini}.get(language, lex_hash)
    serving_file = files.is_serving_path(change.path) or language == files.CONFIG_ENV
    tooling = files.is_tooling(change.path)
    paths: dict[tuple[int, int], tuple[str, ...]] = {}
    for h, hunk in enumerate(change.hunks):
        for side_kind in (REMOVED, ADDED):
            indices = [i for i, line in enumerate(hunk.lines)
                       if line.kind != (ADDED if side_kind == REMOVED else REMOVED)]
            side_paths = key_paths([hunk.lines[i].text for i in indices], language, hunk.section)
            for position, i in enumerate(indices):
                if hunk.lines[i].kind == side_kind or (
                        side_kind == ADDED and hunk.lines[i].kind != REMOVED):
                    paths[(h, i)] = side_paths[position]
    out: list[Ordered] = []
    for item in changed_lines(change, lexer, None, None):
        raw = item.lexed.raw
        if not raw.strip():
            continue
        for signature, start, end, text in RAW.matches(raw):
            if overlaps(item.change.spans, start, end):
                out.append((item.order, finding(change, item, signature, text)))
                break
        if tooling:
            continue
        keys = paths.get(item.order, ())
        own = normal_key(keys[-1]) if keys else ""
        shown = ".".join(keys) if keys else raw.strip()[:40]
        if own and NUMERIC_KEY.fullmatch(own):
            signature = Signature(PRECISION, "", f"changes a precision setting ({shown})")
            out.append((item.order, finding(change, item, signature, "")))
        reason = ""
        if _STRONG_FLAG.search(raw) or _entrypoint(raw):
            reason = f"changes a serving launch command or flag ({shown})"
        elif serving_file or (own and SERVING_KEY.fullmatch(own)) or any(
                files.is_serving_path(key) for key in keys[:-1]):
            kind = "deployment environment" if language == files.CONFIG_ENV else (
                "serving configuration")
            reason = f"changes the {kind} ({shown})"
        if reason:
            out.append((item.order, finding(change, item, Signature(SERVING, "", reason), "")))
    return out


def _lex_ini(lines: Sequence[str]) -> list[Lexed]:
    return lex_hash(lines, semicolons=True)
