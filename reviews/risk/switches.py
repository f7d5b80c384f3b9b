"""The ninth round's families (docs/risk.md, "The ninth round"): kinds of change the eighth
held-out set showed with no finding at all, each read in whatever language spells it.

- parallel-region clauses: a changed OpenMP or OpenACC directive (``#pragma omp ...``,
  ``!$omp ...``, ``#pragma acc ...``): how many threads run a loop, how it is scheduled, what
  is private, critical or atomic; concurrency.
- kernel switches: a setting named for a fused or custom kernel (``use_fused_kernels``,
  ``enable_flash_attn``, ``use_triton_kernel``, ``fused_adam``, ``use_liger``) whose value
  changed, in a configuration or launch file: which kernel computes production's numbers and
  what production runs; numerics and production.
- packaging pins: a quoted requirement with a version specifier (``"numpy<2"``,
  ``'flash-attn>=2.5,<2.7'``) changed in ``setup.py``, ``setup.cfg`` or ``pyproject.toml``
  (``install_requires``, extras, ``dependencies``): the code production installs; production.
- thread counts: a setting, option or default named for a count of threads or workers
  (``infer_thread_count_{2}``, ``max_idle_threads = -1``, ``"grpc-infer-thread-count"``,
  ``CONFIG_ITEM(io_threads, 4)``, ``DEFINE_int32(num_workers, 8, ...)``) declared or changed
  where code declares a setting (an option table, a flag, a config item, a member default in
  an options or config file): how many run at once, and what production is launched with;
  concurrency and production. A thread count in ordinary code stays concurrency only and in
  a configuration file production only, as before.
- GPU capabilities a build targets: in a build file, ``setup.py`` or a build script, a line
  naming a compute capability or an architecture list (``TORCH_CUDA_ARCH_LIST``,
  ``compute_capabilities``, ``MIN_COMPUTE_CAPABILITY "7.5"``, ``-gencode``, ``sm_90a``):
  which GPUs production's build runs on; production.
- Go's concurrency: in Go (read otherwise as a foreign language), a mutex taken or released
  (``mu.Lock()``, ``RUnlock()``, ``TryLock()``), a wait group or condition, a channel sent to
  or received from, a ``select``, a goroutine started, ``sync``/``atomic`` used: what runs at
  once and who waits; concurrency, as the same calls are in the native languages.
- Rust's concurrency (tenth round): in Rust, a lock taken or its guard's scope changed
  (``.lock()``, ``.read()``/``.write()``, ``Mutex``, ``RwLock``), an atomic or an ordering,
  a task spawned, awaited, polled or blocked on (``tokio::spawn``, ``.await``, ``Poll::``,
  ``block_on``), a channel, a semaphore, or the CUDA stream a device is created with
  (``new_cuda_with_stream``); concurrency, as Go's.
- versions of what a build pulls: a key or name ending in ``_version`` / ``Version`` (not a
  package's own ``__version__`` or ``version``) set to a quoted version that changed
  (``"upstream_container_version": "26.05"``, ``TRT_VERSION = "10.1"``); production.
"""
from __future__ import annotations

import re

from reviews.risk import files
from reviews.risk.diff import CONTEXT, FileChange
from reviews.risk.lines import Ordered, line_finding
from reviews.risk.signatures import (
    CONCURRENCY,
    DEPLOY,
    KERNEL,
    LOCKS,
    NUMERICS,
    PRODUCTION,
    THREADS,
)

_PARALLEL_DIRECTIVE = re.compile(r"(?i)^\s*(?:#\s*pragma\s+(?:omp|acc)\b|!\$(?:omp|acc)\b|"
                                 r"_Pragma\s*\(\s*\"(?:omp|acc)\b)")
_KERNEL_SWITCH = re.compile(
    r"(?i)(?:^|[\s\"'{,(.-])((?:use|enable|disable|with)_[\w-]*(?:fused|kernel|flash|triton|"
    r"liger|cutlass|apex|xformers|custom_op)[\w-]*|fused_[\w-]+|[\w-]*_kernels?)"
    r"[\"']?\s*(?::|=(?!=)|,)\s*[\"']?(?:true|false|on|off|yes|no|none|\d+|[\"'][\w.-]*)")
_REQUIREMENT = re.compile(r"""["']\s*[A-Za-z0-9][\w.-]*(?:\[[\w,\s-]*\])?\s*"""
                          r"""(?:[<>=!~]=?|===)\s*[\w.*+!-]+""")
_THREAD_COUNT = re.compile(
    r"(?i)(?<![\w-])([\w-]*(?:threads|workers|(?:thread|worker)[-_]?(?:count|num|number|pool|"
    r"size|cnt))[\w-]*|(?:n|num|max|min)_?(?:threads?|workers?)[\w-]*)(?![\w-])"
    r"(?:[\"']?\s*(?:=(?!=)|:|\{|,)\s*[-+]?\(?[\w:]|[\"'])")
# An option or setting declared in code: an option table's entry, a flag, a config item.
_OPTION_LINE = re.compile(r"\b(?:CONFIG_ITEM|CONFIG_HOT_UPDATED_ITEM|DEFINE_\w+|ABSL_FLAG|"
                          r"add_argument|add_option|cl::opt|GetValue|ParseOption|Field)\s*[(<]|"
                          r"\bOPTION_\w+|\bOption::\w+|[\"'][a-z]+(?:-[a-z]+)+[\"']")
# Where a member's default is a setting: an options, flags, config or command-line file.
_SETTINGS_PATH = re.compile(r"(?i)(?:option|flag|config|command_line|cmdline|cli|args|settings)"
                            r"[^/]*$")
# A log or print call, in any language (its arguments are text a person reads).
LOG_CALL = re.compile(r"(?i)\b(?:print|printf|log\w*|warn\w*|logger|info|debug)\s*[.(]")
_CAPABILITY = re.compile(r"(?i)compute_?capabilit|cuda_?arch|arch_?list|gencode|\bsm_\d|"
                         r"\bcompute_\d|\bcapability\b|gpu_?targets|amdgpu_targets")
_BUILD_SCRIPT = re.compile(r"(?i)(?:^|/)(?:setup\.py|build\w*\.(?:py|sh)|\w*\.cmake|"
                           r"CMakeLists\.txt|BUILD(?:\.bazel)?|\w*\.bzl|Makefile|"
                           r"meson\.build)$")
_GO_CONCURRENCY = re.compile(r"\.(?:R?Lock|R?Unlock|TryR?Lock|Wait|Done|Signal|Broadcast)\(\)|"
                             r"\bsync\.\w+|\batomic\.\w+|<-|\bselect\s*\{|\bgo\s+(?:func\b|"
                             r"[\w.]+\()|\bmake\(\s*chan\b|\bchan\s+\w|\.Add\(\s*-?\d+\s*\)")
# Rust's concurrency: locks and their guards, atomics and orderings, tasks spawned or polled,
# channels, semaphores, async streams, and CUDA streams chosen for a device.
_RUST_CONCURRENCY = re.compile(r"\.(?:lock|try_lock|read|write|try_read|try_write)\(\)|"
                               r"\b(?:Mutex|RwLock|Condvar|Semaphore|Notify|Barrier|"
                               r"Atomic[A-Z]\w*|OnceCell|OnceLock)\b|\bOrdering::\w+|"
                               r"\b(?:tokio::|std::thread::|rayon::)?spawn\w*\s*\(|"
                               r"\.await\b|\bselect!|\bjoin!|\b(?:mpsc|oneshot|broadcast|"
                               r"watch)::|\bPoll::\w+|\bWaker\b|\bwith_stream\b|"
                               r"\bnew_cuda_with_stream\b|\bblock_on\s*\(")
_FOREIGN_CONCURRENCY = {
    "go": (_GO_CONCURRENCY, "changes Go's concurrency (a mutex, a wait group, a channel, a "
           "select, a goroutine, sync or atomic): what runs at once and who waits"),
    "rs": (_RUST_CONCURRENCY, "changes Rust's concurrency (a lock or its guard, an atomic, a task "
           "spawned or polled, a channel, an await, a device's stream): what runs at once and "
           "who waits"),
}
_PACKAGING_FILE = re.compile(r"(?i)(?:^|/)(?:setup\.py|setup\.cfg|pyproject\.toml)$")
_PINNED_VERSION = re.compile(
    r"""(?:^|[\s"'{,(])["']?(?!__version__)([A-Za-z]\w*(?:_version|Version|_VERSION))["']?"""
    r"""\s*(?::|=(?!=))\s*["']v?\d+(?:\.\d+)+[\w.+-]*["']""")


def switches(change: FileChange, language: str | None) -> list[Ordered]:
    """The ninth round's findings of one file (see the module docstring); test files, docs
    and metadata are not read."""
    if language in (None, files.DOCS, files.META) or files.is_test(change.path):
        return []
    native = language in (files.NATIVE, files.SHADER) or change.path.endswith(
        (".f90", ".F90", ".f", ".F", ".for"))
    # In code the analysers read a switch's uses; a configuration or launch file only sets it.
    settings = language in (*files.CONFIG_LANGUAGES, files.SHELL)
    packaging = bool(_PACKAGING_FILE.search(change.path))
    # Go and Rust, read otherwise for their comments only: their concurrency, by its words.
    foreign = _FOREIGN_CONCURRENCY.get(change.path.rsplit(".", 1)[-1])
    code = language in (files.NATIVE, files.PYTHON, files.CYTHON)
    build = bool(_BUILD_SCRIPT.search(change.path))
    out: list[Ordered] = []
    for h, hunk in enumerate(change.hunks):
        for i, line in enumerate(hunk.lines):
            text = line.text
            if line.kind == CONTEXT or not text.strip():
                continue
            stripped = text.strip()
            if foreign and not stripped.startswith("//") and foreign[0].search(text):
                out.append(((h, i), line_finding(change, line, LOCKS, CONCURRENCY, foreign[1])))
                continue
            if native and ("pragma" in text or "$" in text) and _PARALLEL_DIRECTIVE.match(text):
                out.append(((h, i), line_finding(
                    change, line, THREADS, CONCURRENCY,
                    "changes a parallel region's directive (OpenMP/OpenACC): how many threads "
                    "run it, how its iterations are shared, what is private, critical or "
                    "atomic")))
                continue
            if stripped.startswith(("#", "//", "--")) and not stripped.startswith("#define"):
                continue
            m = _KERNEL_SWITCH.search(text) if settings else None
            if m:
                for rule, category in ((KERNEL, NUMERICS), (DEPLOY, PRODUCTION)):
                    out.append(((h, i), line_finding(
                        change, line, rule, category,
                        f"changes a kernel switch ({m.group(1)}): which kernel computes "
                        "production's numbers, and what production runs")))
                continue
            lower = text.lower()
            m = _THREAD_COUNT.search(text) if (code and not build and (
                "thread" in lower or "worker" in lower)) else None
            if m and not LOG_CALL.search(text) and (
                    _OPTION_LINE.search(text) or _SETTINGS_PATH.search(change.path)):
                for category, rule in ((CONCURRENCY, THREADS), (PRODUCTION, DEPLOY)):
                    out.append(((h, i), line_finding(
                        change, line, rule, category,
                        f"declares a count of threads or workers as a setting ({m.group(1)}): "
                        "how many run at once, and what production is launched with")))
                continue
            if build and _CAPABILITY.search(text):
                out.append(((h, i), line_finding(
                    change, line, DEPLOY, PRODUCTION,
                    "changes the GPU capabilities a build targets: which GPUs production's "
                    "build runs on")))
                continue
            if packaging and _REQUIREMENT.search(text):
                out.append(((h, i), line_finding(
                    change, line, DEPLOY, PRODUCTION,
                    "changes a package requirement (setup.py/pyproject.toml): the code "
                    "production installs and runs")))
                continue
            m = _PINNED_VERSION.search(text) if "ersion" in lower or "ERSION" in text else None
            if m:
                out.append(((h, i), line_finding(
                    change, line, DEPLOY, PRODUCTION,
                    f"changes the version of what is built or pulled ({m.group(1)}): the "
                    "code production runs")))
    return out
