"""Environment variables as the classifier reads them: which names a line sets, and which
names configure how ranks and threads wait and meet. Pure: lines in, names out.

A process's environment is set in many places: a Dockerfile's ``ENV``, a shell ``export`` or
a ``NAME=value command`` prefix, a ``.env`` file, a Kubernetes ``env:`` list, Python's
``os.environ``. Wherever it is set, a variable of a collective library or a threading
runtime whose name says it decides threads, workers, blocking, waiting, barriers or which
collective runs (``KMP_BLOCKTIME``, ``OMP_NUM_THREADS``, ``CCL_WORKER_COUNT``,
``NCCL_ASYNC_ERROR_HANDLING``, ``TORCH_LLM_ALLREDUCE``) is a concurrency change as well as a
production one. A transport or memory setting (``NCCL_IB_HCA``, ``NVSHMEM_QP_DEPTH``) is
production only: it decides where bytes go, not who waits for whom.

Contract: ``set_names(code)`` returns the names a line of a Dockerfile, shell script,
``.env`` file or YAML ``env:`` list sets; ``waits_or_meets(name)`` says whether the variable
decides concurrency; ``threading_runtime(text)`` names an OpenMP or TBB runtime library a
line preloads (``LD_PRELOAD=...libiomp5.so``); ``switches_collective(name)`` whether it turns
a collective library on or off; ``draws_or_rounds(name)`` whether it decides the random
numbers drawn or determinism (numerics); ``docker_normal(line)`` is a Dockerfile
instruction in one spelling (``ENV K V`` and ``ENV K=V`` set the same variable).
"""

from __future__ import annotations

import re
from collections.abc import Callable

# The OpenMP and oneAPI threading runtimes: every variable of theirs configures threads.
_RUNTIME_PREFIX = re.compile(r"^(?:KMP|OMP|GOMP|TBB)_")
_CONCURRENCY_WORDS = frozenset({
    "THREAD", "THREADS", "WORKER", "WORKERS", "BLOCKING", "BLOCKTIME", "ASYNC", "CONNECTIONS",
    "STREAM", "STREAMS", "BARRIER", "ALLREDUCE", "ALLGATHER", "ALLTOALL", "TPAUSE", "SPIN",
    "SPINCOUNT", "FORKJOIN", "AFFINITY", "YIELD",
})
# Words of a variable that decides which random numbers are drawn or whether kernels are
# deterministic (NVTE_BUILD_NUM_PHILOX_ROUNDS, PYTHONHASHSEED, CUBLAS_WORKSPACE_CONFIG).
_DRAW_WORDS = frozenset({"PHILOX", "SEED", "PYTHONHASHSEED", "RNG", "RANDOM", "DETERMINISTIC",
                         "DETERMINISM"})
_DRAW_NAMES = frozenset({"CUBLAS_WORKSPACE_CONFIG"})
# Words of a switch of a collective library (not its transport: NCCL_IB_HCA is production).
_COLLECTIVE_WORDS = frozenset({"NCCL", "PYNCCL", "RCCL", "ALLREDUCE", "AR", "NVSHMEM", "MSCCL",
                               "MSCCLPP"})
_SWITCH_WORDS = frozenset({"ENABLE", "ENABLED", "DISABLE", "DISABLED", "USE"})
# Words of a name that only say where files or logs are: not how anything runs.
_PATH_WORDS = frozenset({"ROOT", "PATH", "DIR", "HOME", "LOG", "LOGS", "DEBUG", "FILE",
                         "VERSION"})
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGNED = re.compile(rf"(?:^|\s)(?:export\s+)?({_NAME})=")
_DOCKER_ENV = re.compile(rf"^\s*(?:ENV|ARG)\s+({_NAME})(?:\s+|=)", re.IGNORECASE)
_YAML_ENV = re.compile(rf"""^\s*-?\s*name:\s*["']?({_NAME})["']?\s*$""")
_THREADING_LIBRARY = re.compile(r"lib(?:iomp\d*|gomp|omp\d*|tbb\w*)\.so")
_DOCKER_LEGACY = re.compile(r"^(\s*(?:ENV|LABEL)\s+)([^\s=]+)\s+(.*?)\s*$", re.IGNORECASE)
_DOCKER_ASSIGN = re.compile(r"""^(\s*(?:ENV|LABEL|ARG)\s+)([^\s=]+)=["']?([^"'\s]*)["']?\s*$""",
                            re.IGNORECASE)


def set_names(code: str) -> list[str]:
    """The variables a line sets: ``ENV A=1 B=2``, ``ENV A 1``, a continued ``A=1 \\``,
    ``export A=1``, ``A=1 command``, a YAML ``- name: A``."""
    names = [m.group(1) for m in _ASSIGNED.finditer(code)]
    for pattern in (_DOCKER_ENV, _YAML_ENV):
        match = pattern.match(code)
        if match and match.group(1) not in names:
            names.append(match.group(1))
    return names


def waits_or_meets(name: str) -> bool:
    """Whether the variable decides threads, workers, blocking, waiting, barriers or which
    collective runs (see the module docstring)."""
    words = set(name.upper().split("_"))
    if words & _PATH_WORDS:
        return False
    return bool(_RUNTIME_PREFIX.match(name.upper()) or words & _CONCURRENCY_WORDS)


def switches_collective(name: str) -> bool:
    """Whether the variable turns a collective library or a custom all-reduce on or off
    (``LIGHTLLM_PYNCCL_ENABLE``, ``USE_CUSTOM_ALLREDUCE``): which communicator and stream the
    ranks meet on."""
    words = set(name.upper().split("_"))
    return bool(words & _COLLECTIVE_WORDS) and bool(words & _SWITCH_WORDS)


def draws_or_rounds(name: str) -> bool:
    """Whether the variable decides the random numbers drawn (a seed, a generator's rounds)
    or whether kernels run deterministically: a numerics setting wherever it is set."""
    upper = name.upper()
    words = set(upper.split("_"))
    return not words & _PATH_WORDS and bool(words & _DRAW_WORDS or upper in _DRAW_NAMES)


def threading_runtime(text: str) -> str:
    """The OpenMP or TBB runtime library a line names (libiomp5.so, libgomp.so), or ""."""
    match = _THREADING_LIBRARY.search(text)
    return match.group() if match else ""


def docker_normal(line: str) -> str:
    """A Dockerfile ``ENV``/``LABEL``/``ARG`` line in one spelling: ``ENV K V`` (the legacy
    form) as ``ENV K=V``, quotes around a value without spaces dropped. Other lines as they
    are, without their layout."""
    text = " ".join(line.split())
    legacy = _DOCKER_LEGACY.match(text)
    if legacy and "=" not in legacy.group(2):
        text = f"{legacy.group(1).upper()}{legacy.group(2)}={legacy.group(3)}"
    assign = _DOCKER_ASSIGN.match(text)
    if assign:
        text = f"{assign.group(1).upper()}{assign.group(2)}={assign.group(3)}"
    return text


def runtime_changes(text: str, other: str, decides: Callable[[str], bool] = waits_or_meets,
                    ) -> list[str]:
    """The concurrency variables (and threading runtime libraries) whose setting on the line
    ``text`` the other side of its hunk (``other``, its lines joined) lacks: a variable set,
    unset or given another value, a runtime library preloaded or dropped. ``decides``: which
    names count (``draws_or_rounds`` for the numerics ones; no library then)."""
    squashed = "".join(other.split())
    out = []
    for name in set_names(text):
        setting = re.search(rf"\b{re.escape(name)}(?:=|\s+)\S*", text)
        if decides(name) and setting and (
                "".join(docker_normal(setting.group()).split()) not in squashed):
            out.append(name)
    library = threading_runtime(text) if decides is waits_or_meets else ""
    if library and library not in other:
        out.append(library)
    return out
