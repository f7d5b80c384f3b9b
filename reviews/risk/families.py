"""Families of risky change the per-language analysers miss, and the fail-closed rule. Pure.

Issue 27 measured the analysers on diffs they had never seen: tile, block and split-K sizes
set at module level or in a launcher, loosened tolerances and changed seeds in tests, float
atomics, warp-shuffle masks and moved barriers, serving replicas in decorators, environment
variables set from Python and dtypes in config files went through with no finding. Each is a
*family* here (one pattern over the names such code uses, not one example), searched on the
changed lines with comments blanked and strings masked (``lexers``).

A second held-out set found more: tolerances without the usual names (a row of bare numbers
in a parametrised test), clamps in layout code, random engines seeded in C++, barriers and
waits named by their own words (``cluster_sync``, ``barrier->wait``), cache-hinted loads,
synchronising allocations, conditions over a precision step, kernel switches and launcher
defaults, compiler flags and architectures in build recipes and JIT compilers, environment
variables read as switches; and harmless refactors of kernel code that looked risky (a
temporary inlined, a log-only branch, a docstring's example, a trailing comma).

A third held-out set found more still: communicators split, streams re-owned, host thread
counts, conditions over waits and collectives, what a collective sends, pinned staging
copies, tolerance tables, layouts and TIR statements in kernels, serving limits under other
names, HTTP timeouts, a launcher's strings, presets, environment switches read through a
project's helper; and what changes nothing (a C branch that only logs, a barrier respelled,
a kernel parameter's ``tl.constexpr``).

A fifth held-out set found more: kernels out of the hunk's sight, CPU (SIMD) kernels,
integer widths, float atomics whose operands changed, the dimension an operation works
along, preprocessor conditions and macros judged by what they select or name, waits named
poll or spin, synchronisation primitives and signals in a collective's memory, collectives
under a project's name, code moved into a stream's scope or past a runtime call, environment
switches and build conditions; and what changes nothing (a helper extracted, a message named
then logged, an ``except`` clause, a launcher's help text, a dtype test of bookkeeping, an
option removed with its default branch kept).

A sixth held-out set found more: tolerance tables and thresholds in C tests, exact checks made
bounds, a kernel launch's template sizes, slices, residual sums, conditions on the rank,
grids, brace casts, a distributed tensor's placements, C++ critical sections, buffers kept for
queued GPU work, host reads re-batched, check-then-create races, memory-ordering modes, host
thread counts, configuration defaults, compute-capability tests, a build recipe's pins; and
what changes nothing (a setter's repeated call dropped, chunks materialised).

Contract: ``family_findings(change, language, found, moves, changed)`` returns the extra
findings of one file (order keys as ``analysers.analyse``), given the file's language, what
the analysers ``found`` and which lines they saw ``changed``. Test files get only the test
families (a loosened or rewritten tolerance, a relaxed comparison, a changed seed). And the
classifier fails closed: in a file that holds kernels, launchers, a forward pass, serving or
deployment, a changed line whose numbers, booleans, logic, dtypes, call arguments or
environment values differ, with no finding in the whole file, is ``unclassified``: a
reviewer decides. ``judged_where_used(findings)`` drops the fail-closed findings of a diff
that only define a new name a flagged line of another file uses.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import PurePosixPath

from reviews.risk import files
from reviews.risk.changes import change_runs, normal_tokens
from reviews.risk.code import NATIVE as _NATIVE_SET
from reviews.risk.code import PYTHON as _PYTHON_SET
from reviews.risk.code import UNRUN_ASSERT, MoveIndex
from reviews.risk.diff import ADDED, CONTEXT, REMOVED, DiffLine, FileChange, Hunk
from reviews.risk.environment import switches_collective, waits_or_meets
from reviews.risk.findings import Finding
from reviews.risk.lexers import Lexed, lex_c, lex_python
from reviews.risk.lines import Ordered, line_finding
from reviews.risk.signatures import (
    ACCUMULATION,
    ATOMICS,
    CONCURRENCY,
    DEPLOY,
    FAST_MATH,
    FAST_MATH_FLAGS,
    GPU_ARCH,
    KERNEL,
    LAUNCH,
    LOCKS,
    NUMERICS,
    PRECISION,
    PRODUCTION,
    SERVING,
    SYNC,
    THREADS,
    UNCLASSIFIED,
    UNSURE,
    words,
)

Order = tuple[int, int]

_NUMBER = re.compile(r"(?<![\w.])(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)"
                     r"[uUlLfF]*")
# Sizes, not places: a name ending in _idx, _start or _ptr is a position, and Triton code names
# a block of data x_block (dW_block = DY_block * x_hat), not a size.
_TILE_NAME = (r"(?:\w*(?:BLOCK|TILE|SPLIT|SPLITS|CHUNK|WARPS|STAGES|TACTICS?|CONFIGS?)\w*|"
              r"\w*(?:block|tile|split|splits|chunk)(?:_(?!(?:idx|id|index|ptr|offset|offsets|"
              r"start|end|begin|stop|base|stride)\b)|size)\w*|\w*_(?:tile|tiles|split|splits|"
              r"chunk)|num_warps|num_stages|num_ctas|B[TKVSMNDCH]|BLOCK|BS|NV|NK|"
              r"\w*(?:Block|Tile|Splits?|Warps|Stages)[A-Z]\w*)")
_TILING = re.compile(rf"(?:^|[\s,(]){_TILE_NAME}\s*(?::\s*[\w.\[\], ]+)?=(?!=)|"
                     r"\btriton\.Config\(|\bfor\s+B[A-Z]?\s+in\s+\[")
# A name set to nothing yet (a cache, a table filled later) holds no size.
_EMPTY_VALUE = re.compile(r"=\s*(?:\{\s*\}|\[\s*\]|None|dict\(\s*\)|list\(\s*\))\s*$")
_OPENS_TABLE = re.compile(rf"^\s*{_TILE_NAME}\s*(?::[^=]*)?=\s*[\[({{]\s*$")
_OPENS_NAMED = re.compile(r"^\s*(\w+)\s*(?::[^=]*)?=\s*[\[({]\s*$")
_TOLERANCE = re.compile(r"(?i)\b(?:a?tol|rtol|atol|tolerance|eps|ratio|err_ratio|"
                        r"assert_close|allclose|assert_allclose|isclose|check_close)\b")
# Names of a tolerance as identifier words (abs_tol, fwd_atol, rtol_logits), and a row of bare
# numbers (a parametrised test's table: its columns have no names).
_TOLERANCE_WORDS = frozenset({"tol", "tols", "atol", "rtol", "tolerance", "tolerances", "eps",
                              "epsilon", "reltol", "abstol", "errtol", "xtol", "ftol", "gtol",
                              # a test's thresholds (`float grad_thresholds[N] = {...}`)
                              "threshold", "thresholds", "thresh"})
_TOLERANCE_WORD = re.compile(words(*_TOLERANCE_WORDS))
_NUMBER_ROW = re.compile(r"^\s*[-+]?(?:\d|\.\d)[-+\w.]*\s*(?:,\s*[-+]?(?:\d|\.\d)[-+\w.]*\s*)*,?"
                         r"\s*$")
_COMPARISON = re.compile(r"\b(?:assert_close|allclose|assert_allclose|isclose|assert_verbose_"
                         r"allclose|check_close|assert_almost_equal)\b")
_TOLERANCE_ARGUMENT = re.compile(r"\b(?:atol|rtol|tol|eps|decimal|prec)\s*=(?!=)")
_EXACT = re.compile(r"\b(?:torch\.equal|array_equal|assert_array_equal|assert_equal)\s*\(")
# The names a line assigns, a tuple's included (`fwd_atol, fwd_rtol = 1e-2, 1e-2`).
_ASSIGNED_NAME = re.compile(r"(?m)^\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*"
                            r"(?::[^=\n]*)?=(?!=)")
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
_QUOTED_NAME = re.compile(r"[\"']([A-Za-z_][A-Za-z0-9_]*)[\"']")
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
# A statement that only logs, raises or catches: what is said, or which errors are caught.
_LOG_OR_RAISE = re.compile(r"^\s*(?:raise\b|print\(|\w*\.?(?:log|logger|logging|warn|warning|"
                           r"info|debug|error)\w*\(|warnings\.warn\(|except\b|"
                           r"\}?\s*catch\s*\()")
_CALL = re.compile(r"([\w.]+)\s*\([^)]")
_LOG_CALL = re.compile(r"^\s*(?:[\w.]*\.)?(?:log\w*|logger|logging|warn\w*|print|info|debug|"
                       r"warning|error|critical|exception)\s*\(|^\s*(?:logger|logging|log)\.\w+\(")
_LOG_BRANCH = re.compile(r"^(\s*)(?:(?:el)?if\b[^()]*|else\s*):\s*$")
_VALUE = re.compile(r"(?<![\w.])(?:[2-9]|\d\d+|\d*\.\d+)|\bdtype\b|\b(?:true|false|True|False)\b")
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
                           "exponent", "softcap", "clamp", "clip", "lowest", "infinity",
                           "tol", "atol", "rtol", "tolerance", "rounding", "stochastic"})
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
# Code that samples tokens, and the values a sampler computes with.
_SAMPLER = re.compile(r"(?i)(?:^|/|_)sampl(?:er|ers|ing)\w*\.\w+$|\bmultinomial\w*\(")
_SAMPLED = re.compile(r"(?i)prob|random|logit|temperature|top_?[pk]|min_?p\b|accum|cdf")
# Device code: a line that only GPU code writes.
# A project's device qualifier macro counts: MSCCLPP_DEVICE_INLINE, CUTLASS_DEVICE, TL_DEVICE.
_DEVICE_MARKS = (r"__global__|__device__|__shared__|threadIdx|blockIdx|__syncthreads|__ldg|"
                 r"warpgroup_|cute::|cutlass::arch|__host__|\w*HOST_DEVICE\b|__forceinline__|"
                 r"\b[A-Z][A-Z0-9]+_DEVICE(?:_INLINE|_FUNC|_FORCEINLINE)?\b")
_DEVICE_SUFFIXES = (".cu", ".cuh", ".hip")
_DEVICE_MARK = re.compile(_DEVICE_MARKS)
# Code that runs a compiler: it passes nvcc, NVRTC or hipcc their flags.
_COMPILER = re.compile(r"nvcc|nvrtc|hipcc|ptxas|NVCC|NVRTC|--gpu-architecture|-gencode|"
                       r"--offload-arch|-arch=sm_|\bextra_(?:cuda_)?cflags\b|\bextra_ldflags\b")
_LITERAL = re.compile(r"\b(?:true|false|True|False|None|nullptr)\b|"
                      r"(?<![\w.])-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?[uUlLfF]*|\"[^\"]*\"|'[^']*'")
_KERNEL_DSL = re.compile(r"@triton\.jit|tl\.(?<![\w.]tl\.)\w|cute\.\w|cutlass\.\w|T\.Kernel|"
                         r"tilelang|gluon|T\.prim_func|T\.thread_binding")
_RISKY_CODE = re.compile(r"@triton\.jit|\btl\.\w|__global__|__device__|\bdef\s+forward\b|"
                         r"\bnn\.Module\b|"
                         r"<<<|\bT\.Kernel\b|\bcute\.\w|\btorch\.\w|asm\s+volatile|"
                         r"\b(?:uvicorn|serve|app|server)\.(?:run|start|deployment)\b|"
                         r"\bos\.environ\b|" + _DEVICE_MARKS)

# --- Third round (issue 27, the second held-out set) -----------------------------------------
# A call that synchronises GPU threads, named by its words (cluster_sync, tcgen05_after_thread_
# sync, full_barrier->wait(phase), cp_async_bulk_wait_group, warpgroup_arrive): in kernel code
# a function named as a barrier, fence, wait or arrival is one. Not a warp shuffle, vote or
# reduction (__shfl_xor_sync, __ballot_sync, __reduce_add_sync): they exchange values; nor a
# method release() without arguments (std::unique_ptr's ptr.release() hands over ownership).
_SYNC_WORDS = words("sync", "synchronize", "barrier", "barriers", "fence", "arrive", "wait",
                    "commit", "acquire", "acq", "release", "poll", "spin")
_SYNC_CALL = re.compile(rf"(?:[A-Za-z_]\w*(?:::|\.|->))*\w*(?:{_SYNC_WORDS})\w*"
                        r"(?<!_sync)(?:<[^<>()]*>)?\s*\((?!(?<=[.>]release\()\s*\))|"
                        r"\b(?![\w:]*(?:shfl|ballot|reduce|any_sync|all_sync|match|elect|"
                        r"activemask))[\w:.>-]*_sync(?:<[^<>()]*>)?\s*\(")
# Loads and stores through (or past) a cache whose coherence other threads and kernels see.
_CACHED_ACCESS = re.compile(r"\b__(?:ldg|ldca|ldcg|ldcs|ldlu|ldcv|stwb|stcg|stcs|stwt)\b|"
                            r"\bld\.global\.nc\b|\bld_nc\w*|\bcache_modifier\s*=|"
                            r"\bvolatile\s*=\s*True\b")
# Allocation, free and copies that synchronise the whole device (unlike stream-ordered ones).
_DEVICE_ALLOC = re.compile(r"\b(?:cuda|hip)(?:Malloc|Free|MallocHost|FreeHost|HostAlloc|"
                           r"MallocManaged|Memcpy|Memset|Memcpy2D|DeviceReset)\b|"
                           r"\btorch\.cuda\.empty_cache\b|\bCUDACachingAllocator::\w+")
# A clamp of a value or an index: max(0, i), fminf, __saturatef, tl.maximum, torch.clamp.
_NATIVE_CLAMP = re.compile(r"(?<![\w.>])(?:std::|cuda::std::)?(?:max|min|fmaxf?|fminf?|clamp|"
                           r"__saturatef|saturate)\s*\(")
_PYTHON_CLAMP = re.compile(r"\btl\.(?:maximum|minimum|clamp)\s*\(|\b(?:torch|np|numpy)\."
                           r"(?:clamp|clip|maximum|minimum)\s*\(|\.(?:clamp|clip|clamp_min|"
                           r"clamp_max)_?\s*\(")
# Literals one of which each match of the pattern above contains: searched first, because a
# pattern that starts with a lookbehind or a name class is tried at every position.
_SYNC_HINT = re.compile(r"(?i)sync|barrier|fence|arrive|wait|commit|acq|release|shfl|ballot|"
                        r"activemask|bar\.|poll|spin")
_CLAMP_HINT = re.compile(r"max|min|clamp|clip|satur")
_RNG_HINT = re.compile(r"mt19937|rand|Random|PRNGKey|Generator|ranlux|knuth")
# Random engines and their seeding: std::mt19937(j), srand(0), curand_init(seed, ...).
_RNG = re.compile(r"\b(?:std::)?(?:mt19937(?:_64)?|minstd_rand0?|default_random_engine|"
                  r"ranlux\w+|knuth_b)(?:\s+\w+)?\s*[({]|\b(?:srand|srandom|srand48|"
                  r"curand_init|hiprand_init|RandomState|PRNGKey|random\.Random|"
                  r"Generator\(\)\.manual_seed|torch\.Generator)\s*\(|default_generators\b")
# Which kernel computes: flash attention, SDPA, cuDNN, cuBLAS, Triton, Marlin ... on or off.
_KERNEL_CHOICE = frozenset({"flash", "sdpa", "cudnn", "cublas", "cublaslt", "triton", "marlin",
                            "machete", "exllama", "fused", "deterministic", "tf32", "cutlass",
                            "flashinfer", "xformers", "ck", "allreduce"})
_SWITCH_VALUE = re.compile(r"\b(?:true|false|True|False)\b|[\"'][\w.-]*[\"']|"
                           r"\b[A-Z]\w*\.[A-Z][A-Z0-9_]*\b")
_CONDITION = re.compile(r"^\s*(?:el(?:se\s+)?if|if|while|else\s+if)\b")
_LOGIC_TOKEN = re.compile(r"\b(?:and|or|not|is|in|true|false|True|False|None|nullptr)\b|"
                          r"==|!=|<=|>=|&&|\|\||(?<![<>=!-])[<>](?![<>=])|!(?!=)")
_ENV_READ = re.compile(r"\b(?:os\.environ\.get|os\.getenv|getenv|std::getenv|"
                       r"os\.environ\[[^\]]*\](?!\s*=[^=]))\s*\(?")
# A compiler flag written in a build recipe's string: "-Xfatbin", "--lsr-drop-solution=1".
_FLAG_STRING = re.compile(r"""(["'])(-{1,2}[A-Za-z][^"'\s]*)\1""")
_FAST_MATH_FLAG = re.compile(FAST_MATH_FLAGS.pattern)
_ARCH = re.compile(GPU_ARCH)

# --- Fourth round (issue 27, the third held-out set) -----------------------------------------
# Communicators and process groups split, duplicated or created: which ranks meet in a
# collective, and who else issues work on the same communicator (tp_group->Split(0, 0)).
_COMMUNICATOR = re.compile(r"(?:->|\.)\s*(?:Split|Dup|Clone)\s*\((?=[^)]*\))|"
                           r"\b\w*(?:comm|Comm|group|Group|world|pg|nccl)\w*(?:\[[^\]]*\])?"
                           r"\s*(?:->|\.)\s*(?:split|dup)\s*\((?!\s*[\"'])(?=[^)]*\))|"
                           r"\b(?:nccl|MPI_|mpi_)Comm_?(?:Split|Dup|split|dup|Create|create)\w*"
                           r"\s*\(|\bnew_(?:sub)?groups?\w*\s*\(|\bsplit_group\s*\(")
_COMMUNICATOR_HINT = re.compile(r"plit|Dup|dup|Clone|Comm|new_")
# Names of what a host thread issues GPU work or collectives on: who owns one decides what
# waits for what (a stream shared by every instance of a class).
_STREAM_WORDS = frozenset({"stream", "streams", "event", "events", "communicator", "comm",
                           "comms", "nccl"})
# Names of host threads and workers: a count passed to a pool, an I/O handle, a loader.
_THREAD_HINT = re.compile(r"(?i)thread|worker")
_ARGUMENT_NAME = re.compile(r"[(,]\s*([A-Za-z_]\w*)\s*(?=[,)])")  # a name passed as an argument
_WORKER_WORDS = frozenset({"threads", "nthreads", "workers", "nworkers", "worker"})
# Collectives and stream steps a condition may guard: which ranks or streams meet, not what
# is summed (the reduction's name in the condition is plumbing, `outer_..._grad_reduce`).
_COLLECTIVE = re.compile(r"\b\w*(?:all_reduce|allreduce|reduce_scatter\w*|all_gather\w*|"
                         r"all_to_all\w*|broadcast\w*|barrier|isend|irecv|send|recv)\s*\(|"
                         r"\.(?:wait_stream|synchronize|record_stream|wait_event|wait)\s*\(")
# A collective whose first argument the code around it prepares: the tensor must have the same
# shape on every rank, or the ranks hang.
_SENT = re.compile(r"\b(?:dist|torch\.distributed|group|self\.\w+)\.(?:broadcast|all_reduce|"
                   r"all_gather\w*|reduce_scatter\w*|gather|scatter|reduce|send|recv|isend|"
                   r"irecv|all_to_all\w*)\s*\(\s*(\w+)")
_BINDS = re.compile(r"^\s*(\w+)\s*(?:[-+*/]?=(?!=)|\.(?:append|extend|resize_|copy_)\s*\()")
_CONDITION_HINT = re.compile(r"\b(?:if|while)\b")
_WARP_SYNC_HINT = re.compile(r"fence|sync|barrier|wait|shfl|__|bar\.")
# A file of distributed plumbing: the order ranks issue collectives in is what its sort decides.
_DISTRIBUTED_PATH = re.compile(r"(?i)(?:^|/)(?:distributed|fsdp|ddp|comm\w*|collectives?|"
                               r"parallel_state|zero)(?:/|_|\.)")
_SORTS = re.compile(r"\bsorted\s*\(|\.sort\s*\(")
# Host buffers pinned for asynchronous copies, and the copies themselves: where the host waits.
_PINNED = re.compile(r"\bpin_memory\s*\(|\bpinned\w*|\bnon_blocking\s*=")
# One precision by its spellings (`.float()`, `torch.float32`, `fp32`): a copy rewritten with
# the same precision named on both sides of its run rounds as it did.
_PRECISIONS = (("f32", re.compile(r"\bfloat32\b|\bfp32|\.float\(\)|\btorch\.float\b")),
               ("f16", re.compile(r"\bfloat16\b|\bfp16|\.half\(\)|\btorch\.half\b")),
               ("bf16", re.compile(r"\bbfloat16\b|\bbf16")),
               ("f64", re.compile(r"\bfloat64\b|\bfp64|\.double\(\)")))
# Serving limits under the names engines give them, with their affixes (a per-GPU
# `max_batch_size_map`, `self.prefill_chunk_size`): how production batches requests.
_SERVING_LIMIT = re.compile(r"max_batch_size|prefill_chunk_size|chunked_prefill_size|"
                            r"max_num_seqs|max_num_batched_tokens|max_total_tokens?|"
                            r"max_prefill_tokens|max_running_requests|max_model_len|"
                            r"session_len|cache_max_entry_count|max_concurrency|"
                            r"context_window_size|max_seq_len")
# A timeout of the HTTP layer (a proxy's client, a server's keep-alive): a serving setting.
_NETWORK_TIMEOUT = re.compile(r"(?i)\w*(?:http|api|client|request|read|connect|keep_?alive|"
                              r"proxy)\w*timeout\w*|\w*timeout\w*(?:http|keep_?alive)\w*")
# A file of presets and defaults the service is compiled or started with.
_DEFAULTS_PATH = re.compile(r"(?:^|/)\w*(?:flags|presets?|defaults)\.py$")
_ENUM_VALUE = re.compile(r"\b[A-Z]\w*\.[A-Z][A-Z0-9_]*\b")
# An environment variable read through a project's helper (env_to_bool('LMDEPLOY_X', False)).
_ENV_HELPER = re.compile(r"""\b\w*(?:env|Env|ENV)\w*\s*(?:<[^<>()]*>\s*)?\(\s*["']"""
                         r"""([A-Z][A-Z0-9_]{2,})["']""")
# TVM's TIR (mlc-llm's kernels): T.* calls inside a prim_func are the kernel's statements.
_TIR = re.compile(r"\bT\.(?:prim_func|thread_binding|block|axis|grid|serial|launch_thread|"
                  r"Kernel)\b")
_TIR_CALL = re.compile(r"\bT\.\w+\s*\(")
# A one-line function returning a value (numeric_limits<bf16>::epsilon() { return ...; }).
_RETURNS = re.compile(r"\b(\w+)\s*\([^()]*\)\s*(?:const\s*)?(?:noexcept\s*)?\{\s*return\b")
# Names of a layout: strides, leading dimensions and pitches decide which element is read.
_LAYOUT_WORDS = frozenset({"stride", "strides", "ld", "lda", "ldb", "ldc", "ldd", "pitch"})
# Native code in a kernel library's folders (headers of CUTLASS collectives, fmha kernels).
_DEVICE_PATH = re.compile(r"(?i)(?:^|/)(?:kernels?|fmha|collective|epilogue|cutlass|cute|"
                          r"mainloop)/|(?:^|/)(?:csrc|cuda)/.*\.(?:h|hpp|cuh|inl)$")
# Python in a kernel DSL's folder (CUTLASS's CuTeDSL examples): kernels whose `cute.` calls may
# be out of the hunk's sight.
_DSL_PATH = re.compile(r"(?i)(?:^|/)(?:cutedsl|cute_dsl|gluon)/")
# A log statement of C and C++ (a macro, printf, a stream to std::cerr).
_NATIVE_LOG = re.compile(r"^\s*(?:[\w:]*LOG\w*|[\w:]*Log\w*|printf|fprintf|std::(?:cerr|cout|"
                         r"clog)|spdlog::\w+)\b\s*(?:\(|<<)")
_NATIVE_BRANCH = re.compile(r"^(\s*)(?:\}\s*)?(?:else\s+)?(?:if\s*\((?:[^()]|\w*VERSION\w*"
                            r"\([^()]*\))*\)|else)\s*\{?\s*$")
# A barrier's argument spelled as an enum member or as its string (the newer API):
# ProxyKind.async_shared and "async.shared", SharedSpace.shared_cta and "cta".
_ARGUMENT = re.compile(r"""(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)|["']([^"']*)["']""")


@dataclass
class Families:
    """What the families found in one file, and which of the analysers' findings a family
    explains better: a concurrency change (a barrier, a shuffle's lanes, a guarded store) is
    not also a kernel's arithmetic, and a build recipe's library is not a collective."""

    findings: list[Ordered]
    explained: set[Order]  # lines whose kernel and accumulation findings a family replaces
    linked: set[Order]  # lines of a build recipe: what is linked, not what synchronises
    # A build recipe: its threads are compiler jobs, its dtypes name the sources it compiles.
    build: bool = False
    # Lines where the fourth round's families say what the analysers' rules misread: a
    # network timeout is serving, not a thread's wait; a branch that only logs, a barrier or
    # a copy respelled changes nothing of theirs (line -> the rules that give way).
    given_way: dict[Order, set[str]] = field(default_factory=dict)
    # Lines that compute as before (a helper extracted, a dtype test of bookkeeping, a
    # message): no family reads them and the fail-closed rule does not either.
    quiet: set[Order] = field(default_factory=set)

    def supersedes(self, order: Order, finding: Finding) -> bool:
        """Whether the analysers' ``finding`` at ``order`` gives way to a family's."""
        return (order in self.explained and finding.rule in (KERNEL, ACCUMULATION)) or (
            order in self.linked and finding.category == CONCURRENCY) or (
            self.build and (finding.rule == THREADS or (
                finding.category == NUMERICS and finding.rule != FAST_MATH))) or (
            finding.rule in self.given_way.get(order, ()))

    def give_way(self, orders: Iterable[Order], *rules: str) -> None:
        for order in orders:
            self.given_way.setdefault(order, set()).update(rules)


@dataclass(frozen=True)
class _File:
    """What one file of code is, and what the analysers found in it, as the families read
    its lines."""

    python: bool
    test: bool
    build: bool  # a build recipe (setup.py, torch's extension builders)
    device: bool  # holds GPU kernels: CUDA or HIP source, device code, a kernel DSL
    risky: bool  # holds kernels, launchers, a forward pass, serving or deployment
    launcher: bool  # its path says it starts or serves the service
    distributed: bool  # its path says it is distributed plumbing (fsdp, comm, collectives)
    defaults: bool  # its path says it holds presets the service is built or started with
    tir: bool  # its diff shows TVM TIR kernels (T.prim_func, T.thread_binding)
    compiler: bool  # runs a compiler: a build recipe or code that passes nvcc flags
    unseen_kernel: bool  # the analysers found no numerics: a kernel's def may be out of sight
    flagged: frozenset[Order]  # lines the analysers found something on
    precision: frozenset[Order]  # lines the analysers found numerics (not fast-math) on
    changed: frozenset[Order] | None  # code lines whose tokens changed (None: not known)
    sides: dict[str, str]  # each side's changed lines of the whole file, without layout
    sampler: bool = False  # its path or diff says it samples tokens (sampling.cpp, multinomial)
    options: frozenset[str] = frozenset()  # parameters with a default the diff removes
    # Its path says it is a collective's or a communication library's code (custom all-reduce
    # kernels, IPC, NVSHMEM), or its diff shows atomics or fences: its flags are signals.
    collective: bool = False
    # Its file name says it implements a synchronisation primitive (rw_spinlock.h, barrier.cc).
    primitive: bool = False
    # Its file name says it holds the service's configuration (config.h, settings.py).
    configuration: bool = False


def _file_of(change: FileChange, language: str | None, found: Sequence[Ordered],
             changed: set[Order] | None) -> _File:
    python = language in (files.PYTHON, files.CYTHON)
    code = python or language in (files.NATIVE, files.SHADER)
    test = files.is_test(change.path)
    text = _diff_text(change)
    build = python and not test and _is_build_recipe(change, text)
    device_code = code and not test and _holds_device_code(change, language, text)
    return _File(
        python=python, test=test, build=build,
        device=device_code or (code and not test and bool(
            (_DEVICE_PATH if language == files.NATIVE else _DSL_PATH).search(change.path))),
        # A build recipe's own arithmetic (jobs, memory per job) is how fast the wheel builds.
        risky=code and not test and not build and _holds_risky_code(change, text),
        launcher=code and files.is_launcher(change.path),
        distributed=bool(_DISTRIBUTED_PATH.search(change.path)),
        defaults=bool(_DEFAULTS_PATH.search(change.path)),
        tir=python and bool(_TIR.search(text)),
        compiler=build or (code and not test and bool(_COMPILER.search(text))),
        unseen_kernel=python and not any(f.category == NUMERICS for _, f in found),
        flagged=frozenset(order for order, _ in found),
        precision=frozenset(order for order, f in found
                            if f.category == NUMERICS and f.rule != FAST_MATH),
        changed=None if changed is None else frozenset(changed),
        sampler=code and not test and bool(_SAMPLER.search(change.path) or _SAMPLER.search(text)),
        options=_removed_options(change) if python and not test else frozenset(),
        collective=device_code and bool(
            _COMMUNICATION_PATH.search(change.path) or _ORDERED_MEMORY.search(text)),
        primitive=code and bool(set(_words_of(PurePosixPath(change.path).stem))
                                & (_SYNC_PRIMITIVE_WORDS | {"lock", "rwlock"})),
        configuration=code and not test and bool(set(_words_of(PurePosixPath(
            change.path).stem)) & _CONFIGURATION_WORDS),
        # A read moved between hunks, a check relaxed in another hunk: the whole file's sides.
        sides=_file_sides(change, lex_python if python else lex_c) if build or test else (
            {ADDED: "", REMOVED: ""}))


def family_findings(change: FileChange, language: str | None, found: Sequence[Ordered],
                    moves: MoveIndex | None = None,
                    changed: set[Order] | None = None) -> Families:
    """The families' findings of one file and, when nothing at all was found in a file that
    runs kernels or serves, the fail-closed ``unclassified`` ones (see the module docstring).
    ``changed``: the code lines the analysers saw change (a line outside it was renamed,
    re-wrapped or had a temporary inlined): the fallback rules read only those."""
    code = language in (files.PYTHON, files.CYTHON, files.NATIVE, files.SHADER)
    config = language in files.CONFIG_LANGUAGES
    families = Families([], set(), set())
    if not (code or config):
        return families
    kind = _file_of(change, language, found, changed)
    families.build = kind.build
    lexer = lex_python if kind.python else lex_c
    out = families.findings
    unsure: list[Ordered] = []
    if code and not kind.test:
        for h, i in _across_barrier(change, kind.device, kind.python):
            out.append(((h, i), line_finding(change, change.hunks[h].lines[i], SYNC, CONCURRENCY,
                                         "moves code across a barrier, a stream's scope or a "
                                         "runtime call: what the other threads see when they "
                                         "pass it, or which stream and device run it")))
            if kind.device:  # the run is explained by its order, as the analysers' barriers are
                families.explained.update(_run_of(change.hunks[h], i, h))
            else:  # a moved line's tokens are the same: its order is what changed
                families.explained.add((h, i))
    lexed_hunks = [None if config else lexer([line.text for line in hunk.lines])
                   for hunk in change.hunks]
    hunk_lines = [list(_lines(hunk, lexer, config, lexed))
                  for hunk, lexed in zip(change.hunks, lexed_hunks, strict=True)]
    if kind.python and not kind.test and any(
            line.kind == ADDED and "def " in line.code for lines in hunk_lines for line in lines):
        extracted = _extractions(change, hunk_lines)
        families.give_way(extracted, KERNEL, ACCUMULATION, PRECISION)
        families.quiet |= extracted
    for h, hunk in enumerate(change.hunks):
        lexed = lexed_hunks[h]
        lines = hunk_lines[h]
        same = set() if lexed is None else equivalent_runs(hunk.lines, lexed)
        logged = _log_only(lines, kind.python) if code and not kind.test else set()
        families.explained.update((h, i) for i in logged)
        if not kind.python:  # a C branch that only logs: its condition is nobody's collective
            families.give_way(((h, i) for i in logged), SYNC, KERNEL, ACCUMULATION)
        if code and not kind.test:
            out += [((h, i), line_finding(change, hunk.lines[i], rule, category, reason))
                    for i, (rule, category, reason) in _fourth_round_runs(lines, h, kind,
                                                                          families)]
        if code and not kind.test:
            out += [((h, i), line_finding(change, hunk.lines[i], rule, category, reason))
                    for i, (rule, category, reason) in _sixth_round_runs(lines, h, hunk, kind,
                                                                         families)]
        if code and not kind.test:
            out += [((h, i), line_finding(change, hunk.lines[i], rule, category, reason))
                    for i, (rule, category, reason) in _seventh_round_runs(lines, h, hunk, kind,
                                                                           families)]
        if kind.test:
            out += [((h, i), line_finding(change, hunk.lines[i], PRECISION, NUMERICS, "reorders "
                                      "or rewrites a tolerance table in a test: some entry now "
                                      "allows more than it did"))
                    for i in _tolerance_tables(lines)]
        if code and not kind.test:
            for i, reason in _lanes_and_writers(lines):
                families.explained.add((h, i))
                out.append(((h, i), line_finding(change, hunk.lines[i], SYNC, CONCURRENCY, reason)))
        for i, line in enumerate(lines):
            if line.kind == CONTEXT or i in same:
                continue
            order = (h, i)
            if kind.test:
                hits = _test_hits(line, kind.sides[ADDED])
            elif config:
                hits = _config_hits(line)
            else:
                hits = _code_line_hits(lines, i, order, kind, families, hunk)
            out += [(order, line_finding(change, hunk.lines[i], rule, category, reason))
                    for rule, category, reason in hits]
            moved = moves is not None and moves.elsewhere(change.path, hunk.lines[i])
            if kind.risky and not hits and not moved and i not in logged and (
                    order not in families.quiet) and (
                    kind.changed is None or order in kind.changed) and _changes_a_value(line) and (
                    not UNRUN_ASSERT.match(line.code)):
                unsure.append((order, line_finding(
                    change, hunk.lines[i], UNSURE, UNCLASSIFIED,
                    "changes a number, boolean, condition, dtype, call argument or environment "
                    "value in code that runs kernels or serves, and no rule knows it: a reviewer "
                    "decides")))
    if families.explained or families.given_way:  # explained late: its findings go too
        families.findings = [(order, f) for order, f in out if not (
            order in families.explained and f.rule in (KERNEL, ACCUMULATION)) and (
            f.rule not in families.given_way.get(order, ()))]
    kept = [(order, f) for order, f in found if not families.supersedes(order, f)]
    if not kept and not families.findings:
        subject = _file_subject(change.path) if unsure else None
        if subject is not None:  # the file's name says what its values decide
            rule, category = subject
            unsure = [(order, line_finding(change, change.hunks[order[0]].lines[order[1]], rule,
                                       category, "changes a value in code whose file says "
                                       f"what it decides ({PurePosixPath(change.path).name}): "
                                       "no other rule knows it"))
                      for order, _ in unsure]
        families.findings = unsure
    return families


def _code_line_hits(lines: Sequence[_Line], i: int, order: Order, kind: _File,
                    families: Families, hunk: Hunk) -> list[_Hit]:
    """The families of one changed line of code (not a test), and what they explain."""
    line = lines[i]
    ordering = _ordering_hits(line, kind)
    if ordering and kind.device:  # the run's kernel findings give way, as the analysers' do
        families.explained.update(_run_of(hunk, i, order[0]))
    seen = kind.changed is None or order in kind.changed
    hits = _code_hits(line, kind.unseen_kernel and seen) + ordering + _gpu_hits(
        line, lines, i, kind)
    if order in families.explained:  # concurrency only, as the analysers'
        hits = [hit for hit in hits if hit[1] != NUMERICS]
    if kind.compiler:
        hits += _compiler_hits(line, kind.build and order in kind.precision)
    if kind.build and _BUILD_LINE.search(line.text) and not _untouched_reads(
            line, kind.sides[REMOVED if line.kind == ADDED else ADDED]):
        families.linked.add(order)
        hits = [(DEPLOY, PRODUCTION, "changes a build recipe's libraries, link arguments, "
                 "architectures or build environment: the binary production runs")] + [
            hit for hit in hits if hit[1] != CONCURRENCY]
    hits += _fourth_round_hits(line, order, kind, families)
    hits += _sixth_round_hits(line, order, kind, families, hunk)
    hits += _seventh_round_hits(line, order, kind, hunk)
    if kind.sampler and seen and not hits and _SAMPLED.search(line.code) and _changes_a_value(
            line):
        hits.append((PRECISION, NUMERICS, "changes a sampler's arithmetic (its probabilities, "
                     "random point or cut-off): which token comes out, and how rounding errs"))
    if _CLAMPED in hits and any(hit[1] == CONCURRENCY for hit in hits):
        hits.remove(_CLAMPED)  # weak: a block count clamped for a grid barrier
    if kind.build:  # compiler jobs, not serving threads; which kernels are built, not how
        hits = [hit for hit in hits if hit[0] != THREADS and (  # they round
            hit[1] != NUMERICS or hit[0] == FAST_MATH)]
    elif kind.risky and order not in kind.flagged and not hits:
        hits = _reads_environment(line)
    elif kind.risky and line.target and not any(hit[1] == PRODUCTION for hit in hits):
        hits += _reads_environment(line, new_only=True)  # a switch read anew from the env
    return _distinct(hits)


def _log_only(lines: Sequence[_Line], python: bool = True) -> set[int]:
    """The changed lines of a hunk that only log: a log or print call with the lines its
    arguments run over, and an ``if``/``elif``/``else`` (on plain comparisons, no call; in
    C, a version macro) whose body only logs. Their text is what a reader sees; no value
    changes."""
    out: set[int] = set()
    call = _LOG_CALL if python else _NATIVE_LOG
    branch = _LOG_BRANCH if python else _NATIVE_BRANCH
    if not any(call.match(line.code) for line in lines):
        return out
    for side in (ADDED, REMOVED):
        indices = [i for i, line in enumerate(lines) if line.kind in (CONTEXT, side)]
        logging = _log_lines(lines, indices, call)
        if python:  # a message named first, then logged: `warning = """..."""; log(warning)`
            logging |= _messages(lines, indices, logging)
        for position, i in enumerate(indices):
            header = branch.match(lines[i].code)
            if header is None:
                continue
            indent = len(header.group(1))
            body = [k for k in indices[position + 1:] if lines[k].code.strip()]
            block = []
            for k in body:
                if len(lines[k].code) - len(lines[k].code.lstrip()) <= indent:
                    break
                block.append(k)
            if block and all(k in logging for k in block):
                logging.add(i)
        out |= {i for i in logging if lines[i].kind == side}
    return out


_MESSAGE = re.compile(r"^\s*([A-Za-z_]\w*)\s*=\s*[rfbuRFBU]*[\"']")


def _messages(lines: Sequence[_Line], indices: Sequence[int], logging: set[int]) -> set[int]:
    """The lines of one side that assign a string to a name which the side only logs (a
    warning's text named, then passed to ``logger.warning``): text, not code."""
    out: set[int] = set()
    for i in indices:
        named = _MESSAGE.match(lines[i].raw)
        if named is None or lines[i].kind == CONTEXT or _untouched(lines[i].code, lines[i]):
            continue
        uses = [k for k in indices if k != i and named.group(1) in lines[k].code and (
            named.group(1) in _NAME.findall(lines[k].code))]
        if uses and all(k in logging for k in uses):
            out.add(i)
    return out


def _log_lines(lines: Sequence[_Line], indices: Sequence[int],
               call: re.Pattern[str] = _LOG_CALL) -> set[int]:
    """The lines of one side that are log or print calls, with their continuation lines."""
    out: set[int] = set()
    depth = 0
    for i in indices:
        code = lines[i].code
        if depth > 0 or (call.match(code)):
            out.add(i)
            depth = max(0, depth + code.count("(") - code.count(")"))
    return out


def equivalent_runs(lines: Sequence[DiffLine], lexed: Sequence[Lexed]) -> set[int]:
    """The lines of the hunk's runs whose two sides compile to the same (``normal_tokens``:
    `NULL` -> `nullptr`, `;;` -> `;`, a declared parameter named): no family reads them."""
    out: set[int] = set()
    for run in change_runs(lines):
        if 2 * sum(1 for k in run if lines[k].kind == ADDED) != len(run):
            continue  # a line added or dropped: not a respelling line for line
        old = [(k, t) for k in run if lines[k].kind == REMOVED for t in lexed[k].tokens]
        new = [(k, t) for k in run if lines[k].kind == ADDED for t in lexed[k].tokens]
        if old and new and normal_tokens(old) == normal_tokens(new):
            out.update(run)
    return out


def _run_of(hunk: Hunk, i: int, h: int) -> set[Order]:
    """The orders of the run of changed lines (no context between) that line ``i`` is in."""
    lines = hunk.lines
    start, end = i, i
    while start > 0 and lines[start - 1].kind != CONTEXT:
        start -= 1
    while end + 1 < len(lines) and lines[end + 1].kind != CONTEXT:
        end += 1
    return {(h, k) for k in range(start, end + 1)}


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
    raw: str = ""  # the line with its strings, comments blanked
    sides: _RawSides | None = None  # the hunk's sides with their strings
    target: str | None = None  # the name the line assigns or #defines, if any
    opened: str = ""  # the name of the table (``ERROR_ATOL = {``) the line sits in, if any

    @property
    def raw_other(self) -> str:
        """The other side's lines with their strings (comments blanked), joined."""
        if self.sides is None:
            return ""
        return self.sides.joined(REMOVED if self.kind == ADDED else ADDED)



class _RawSides:
    """A hunk's changed lines with their strings, by side, joined when first asked for: most
    lines never need them."""

    def __init__(self) -> None:
        self.lines: dict[str, list[str]] = {ADDED: [], REMOVED: []}
        self._joined: dict[str, str] = {}

    def joined(self, kind: str) -> str:
        if kind not in self._joined:
            lines = [" ".join(raw.split()) for raw in self.lines[kind]]
            self._joined[kind] = "\n".join(lines) + "\n" + _squash("".join(lines))
        return self._joined[kind]


def _lines(hunk: Hunk, lexer: Callable[[Sequence[str]], list[Lexed]],
           config: bool, lexed: list[Lexed] | None = None) -> Iterator[_Line]:
    """The hunk's lines with their counterparts on the other side (see ``_Line``)."""
    texts = [line.text for line in hunk.lines]
    if lexed is None and not config:
        lexed = lexer(texts)
    masked = texts if lexed is None else [item.code for item in lexed]
    raws = texts if lexed is None else [item.raw for item in lexed]
    table = ""
    shapes: dict[str, dict[str, str]] = {ADDED: {}, REMOVED: {}}
    forms: dict[str, dict[str, str]] = {ADDED: {}, REMOVED: {}}
    sides: dict[str, list[str]] = {ADDED: [], REMOVED: []}
    raw_sides = _RawSides()
    for line, code, raw in zip(hunk.lines, masked, raws, strict=True):
        if line.kind != CONTEXT:
            shapes[line.kind].setdefault(_shape(code), code)
            forms[line.kind].setdefault(_form(code), code)
            sides[line.kind].append(" ".join(code.split()))
            raw_sides.lines[line.kind].append(raw)
    joined = {kind: "\n".join(lines) + "\n" + _squash("".join(lines))
              for kind, lines in sides.items()}
    depth = 0  # open brackets of a decorator's call
    opened = ""
    for line, code, raw in zip(hunk.lines, masked, raws, strict=True):
        decorated = depth > 0 or bool(_DECORATOR.match(code))
        if decorated:
            depth = max(0, depth + code.count("(") - code.count(")"))
        opener = _OPENS_NAMED.match(code)
        if _OPENS_TABLE.match(code):
            table = code
        elif code.strip()[:1] in ("]", ")", "}") and not code.startswith((" " * 8, "\t\t")):
            table = ""
        if opener:
            opened = opener.group(1)
        elif code.strip()[:1] in ("]", ")", "}"):
            opened = ""
        if line.kind == CONTEXT:
            yield _Line(line.kind, line.text, code, table, None, None, "", decorated, raw)
            continue
        other = REMOVED if line.kind == ADDED else ADDED
        yield _Line(line.kind, line.text, code, table, shapes[other].get(_shape(code)),
                    forms[other].get(_form(code)), joined[other], decorated, raw, raw_sides,
                    _assigned(code), "" if opener else opened)


def _across_barrier(change: FileChange, device: bool = False,
                    python: bool = False) -> list[Order]:
    """The changed lines whose order against a barrier changed: a statement moved from one
    side of a barrier to the other (within a hunk or from one hunk to another), or a barrier
    moved past statements. The barrier may be an unchanged line, a moved one, or one the
    change adds or removes between a statement's two places (TMEM freed after a new
    cluster_sync rather than before); in kernel code a call named as a barrier, fence, wait
    or acquire is one. A block moved or re-indented whole keeps its order: nothing to report.
    Places are (hunk, line) in diff order: the file between hunks is out of sight."""
    lines = [((h, i), line) for h, hunk in enumerate(change.hunks)
             for i, line in enumerate(hunk.lines)]
    norm = {order: " ".join(line.text.split()) for order, line in lines}
    sides: dict[str, dict[str, list[Order]]] = {REMOVED: {}, ADDED: {}}
    comment = ("#",) if python else ("//", "/*", "* ")
    for order, line in lines:
        if line.kind != CONTEXT and norm[order] and not norm[order].startswith(comment):
            sides[line.kind].setdefault(norm[order], []).append(order)
    # Each line on both sides, as (its place in the old side, its place in the new side): the
    # k-th removed copy of a text pairs with its k-th added copy.
    both = [pair for text in sides[REMOVED].keys() & sides[ADDED].keys()
            for pair in zip(sides[REMOVED][text], sides[ADDED][text], strict=False)]
    if not both:
        return []  # nothing moved: a barrier added or removed alone is a change of its own
    partner = {a: b for pair in both for a, b in (pair, pair[::-1])}
    both += [(o, o) for o, line in lines if line.kind == CONTEXT and norm[o]]
    kinds = dict(lines)
    out: set[Order] = set()
    for order, line in lines:
        if not _is_barrier(line.text, device, python):
            continue
        # The barrier's place on each side: its own line there, else where the diff shows it.
        old = partner.get(order, order) if line.kind == ADDED else order
        new = partner.get(order, order) if line.kind == REMOVED else order
        for there, here in both:
            if order not in (there, here) and (there < old) != (here < new):
                out.update(o for o in (there, here, old, new) if kinds[o].kind != CONTEXT)
    return sorted(out)


def _is_barrier(text: str, device: bool, python: bool = False) -> bool:
    """A barrier, fence or wait (in kernel code, a call named as one); in Python, a stream's
    scope or a wait between streams or ranks (the lines after ``with torch.cuda.stream(s):``
    run on another stream); in host C and C++, a CUDA or HIP runtime call, which works on the
    calling thread's current device, stream and capture mode (a thread's set-up moved after
    one changes what it does)."""
    if python:
        code = text.split("#", 1)[0]
        return ("stream" in code or "Stream" in code or "wait" in code or "synchronize" in code
                or "barrier" in code or "record" in code) and bool(_PY_ORDERING.search(code))
    code = text.split("//", 1)[0]
    if not device and ("cu" in code or "hip" in code) and _RUNTIME_CALL.search(code):
        return True
    return bool(_SYNC_HINT.search(code)) and bool(
        _WARP_SYNC.search(code) or (device and _SYNC_CALL.search(code)))


# Where Python code's order against streams and ranks is decided.
_PY_ORDERING = re.compile(r"^\s*(?:async\s+)?with\s+[\w.]*\b(?:stream|Stream|use_stream)\s*\(|"
                          r"\.(?:wait_event|wait_stream|synchronize|record_event)\s*\(|"
                          r"\b(?:dist|torch\.distributed)\.barrier\s*\(")
# A CUDA or HIP runtime or driver call on the host (cudaSetDevice, cudaStreamCreate,
# cuCtxSetCurrent); not a query (cudaGetLastError, cudaDeviceGetAttribute).
_RUNTIME_CALL = re.compile(r"\b(?:cuda|hip|cu)(?!Get|Peek|DeviceGet|FuncGet|Occupancy)[A-Z]\w*"
                           r"\s*\(")


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
    """The text without layout: no whitespace, no trailing comma before a bracket or at the
    end (an enumerator or list item that gains a comma because another now follows it)."""
    return _TRAILING_COMMA.sub(r"\1", "".join(text.split())).rstrip(",")


def _numbers_differ(line: _Line) -> bool:
    kin = line.twin if line.twin is not None else line.kin
    return kin is not None and _NUMBER.findall(kin) != _NUMBER.findall(line.code)


_Hit = tuple[str, str, str]


def _code_hits(line: _Line, unseen_kernel: bool = False) -> list[_Hit]:
    code, text = line.code, line.text
    hits: list[_Hit] = []
    tiling = (_TILING.search(code) or line.table) and not _untouched(code, line) and (
        line.table or _sizes_assigned_anew(line))
    renamed = line.kin is not None and not _numbers_differ(line)
    if renamed:
        tiling = False  # a rename
    if tiling and (_NUMBER.search(code + (line.twin or "")) or _SIZE_CALL.search(code)
                   or (_new(_TILING, line) and not _EMPTY_VALUE.search(code))):
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
        if any(waits_or_meets(name) for name in _QUOTED_NAME.findall(text)):
            hits.append((THREADS, CONCURRENCY, "sets an environment variable that decides "
                         "threads, workers, streams, connections, blocking or collectives"))
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
    if _new(_RESIDENCY, line) or (_RESIDENCY.search(line.target or "") and words):
        hits.append((SYNC, CONCURRENCY, "changes how many blocks run at once: a grid-wide "
                     "barrier or a persistent kernel needs all of its blocks resident"))
    return _distinct(hits)


_TILE_ASSIGNMENT = re.compile(rf"(?:^|[\s,(])({_TILE_NAME})\s*(?::\s*[\w.\[\], ]+)?=(?!=)")
_POOL_MAP = re.compile(r"\.(?:i?map\w*|starmap\w*)\s*\(")
_NOT_A_SIZE = re.compile(r"^(?:True|False|None|true|false|nullptr|[\"'].*)$")


def _sizes_assigned_anew(line: _Line) -> bool:
    """Whether the line gives a tile, block or split name a size the other side does not
    (a re-wrapped signature keeps each parameter's default: `split_batches: bool = False` on
    both sides), or is a tuning table's config; a boolean, None or a string is a switch, not
    a size."""
    assignments = [(m.group(1), _value_end_text(line.code, m.end()))
                   for m in _TILE_ASSIGNMENT.finditer(line.code)]
    if not assignments:
        return True  # triton.Config(, a loop over block sizes: judged as before
    other = _squash(line.other)
    for name, value in assignments:
        if _NOT_A_SIZE.match(value) or (name == "chunksize" and _POOL_MAP.search(line.code)):
            continue  # a switch; how many items a process pool hands a worker at once
        if re.fullmatch(rf"(?:list|tuple|set|sorted|iter)\({re.escape(name)}\)", value):
            continue  # chunks materialised (`chunks = list(chunks)`): the same items, no size
        if not value or not _assigns(other, name, value):
            return True
    return False


_ANNOTATED_EQUALS = re.compile(r"(?::[^=,]*)?=(?!=)")


def _assigns(text: str, name: str, value: str) -> bool:
    """Whether ``text`` (without layout) assigns ``value`` to ``name``, a type hint aside."""
    at = text.find(name)
    while at >= 0:
        before = text[at - 1:at]
        equals = _ANNOTATED_EQUALS.match(text, at + len(name))
        if equals and not (before.isalnum() or before == "_") and text.startswith(
                value, equals.end()):
            after = text[equals.end() + len(value):equals.end() + len(value) + 1]
            if not (after.isalnum() or after in ("_", ".")):
                return True
        at = text.find(name, at + 1)
    return False


_CLAMPED = (PRECISION, NUMERICS, "adds or removes a clamp (max(0, ...), min, clamp): which "
            "element is read or written, or the range a value is held in")


def _ordering_hits(line: _Line, kind: _File) -> list[_Hit]:
    """Ordering between GPU threads, streams or kernels: a barrier, fence or wait by name, a
    cache-hinted load, an allocation that synchronises the device. Such a change explains
    its run: the statements around it are not also a kernel's arithmetic."""
    code = line.code
    hits: list[_Hit] = []
    if kind.device and _SYNC_HINT.search(code) and _SYNC_CALL.search(code) and (
            not _untouched(code, line)) and (
            not _LOG_OR_RAISE.match(code)):
        hits.append((SYNC, CONCURRENCY, "changes a barrier, fence, wait or arrival between GPU "
                     "threads: which threads wait for which, and what they see"))
    if ("__" in code or "cache_modifier" in code or "volatile" in code or "ld" in code) and (
            _new(_CACHED_ACCESS, line)):
        hits.append((SYNC, CONCURRENCY, "changes how a load or store reaches memory (__ldg, a "
                     "cache modifier): what it sees of other threads' and kernels' writes"))
    if ("cuda" in code or "hip" in code or "CUDACaching" in code) and any(
            not re.search(rf"\b{m.group()}\b", line.other) for m in _DEVICE_ALLOC.finditer(code)):
        hits.append((SYNC, CONCURRENCY, "allocates, frees or copies with an implicit "
                     "device-wide synchronisation (cudaMalloc, cudaFree, cudaMemcpy): every "
                     "stream waits for it"))
    return hits


def _gpu_hits(line: _Line, lines: Sequence[_Line], i: int, kind: _File) -> list[_Hit]:
    """The third round's numerics and production families on one changed code line: clamps,
    random engines, conditions over a precision step, kernel switches and a launcher's
    defaults (see docs/risk.md)."""
    hits: list[_Hit] = []
    clamp = _PYTHON_CLAMP if kind.python else _NATIVE_CLAMP
    if (kind.device or (kind.python and kind.risky)) and _CLAMP_HINT.search(line.code) and (
            _new(clamp, line)):
        hits.append(_CLAMPED)
    if _RNG_HINT.search(line.code) and _new_call(_RNG, line):
        hits.append((PRECISION, NUMERICS, "changes a random engine or its seed: the numbers "
                     "drawn"))
    if (kind.risky or kind.device) and _guards_precision(lines, i, kind.python, kind.options):
        hits.append((PRECISION, NUMERICS, "changes when a precision, cast or quantisation step "
                     "runs (the condition over it): which values are converted"))
    name = line.target
    if name and set(_words_of(name)) & _KERNEL_CHOICE and _assigned_anew(
            name, line, _SWITCH_VALUE, _ENV_VALUE):
        hits.append((PRECISION, NUMERICS, f"switches which kernel computes ({name}): another "
                     "kernel rounds and accumulates differently"))
    if kind.launcher and name and name not in _TEXT_KEYWORDS and _assigned_anew(
            name, line, _LITERAL):
        hits.append((SERVING, PRODUCTION, f"changes a default the server or launcher starts "
                     f"with ({name})"))
    return hits


def _compiler_hits(line: _Line, precision: bool) -> list[_Hit]:
    """In a build recipe or code that runs a compiler: a new compiler flag (other than a
    fast-math one, which is numerics) or GPU architecture; in a build recipe, a precision
    named (which kernels are built, not how they round)."""
    if _untouched(line.raw, line) or _untouched_raw(line.raw, line):
        return []
    flags = [m.group() for m in _FLAG_STRING.finditer(line.raw)
             if not _untouched_raw(m.group(), line)]
    hits: list[_Hit] = []
    if any(not _FAST_MATH_FLAG.search(flag) for flag in flags):
        hits.append((DEPLOY, PRODUCTION, "changes a compiler flag the build passes: the binary "
                     "production runs"))
    if _ARCH.search(line.raw):
        hits.append((DEPLOY, PRODUCTION, "changes the GPU architectures code is compiled for: "
                     "the binary production runs"))
    if precision:
        hits.append((DEPLOY, PRODUCTION, "names a precision in a build recipe: which kernels "
                     "are built into the binary production runs"))
    return hits


def _reads_environment(line: _Line, new_only: bool = False) -> list[_Hit]:
    """A changed line that reads an environment variable (a new read, or its default or test
    changed) and that no other rule explains, in code that runs kernels or serves: a switch
    production sets when it deploys. ``new_only``: only a read the other side lacks (a new
    variable, or its default changed), whatever else the line changes."""
    reads = [m for m in _ENV_READ.finditer(line.code)] + [
        m for m in _ENV_MEMBER.finditer(line.raw)]
    if not reads or _untouched_raw(line.raw, line):
        return []
    if new_only and all(_untouched_raw(_call_text(line.raw, m.start()), line)
                        or not _is_switch_value(line.code, m.start()) for m in reads):
        return []
    hits: list[_Hit] = [(SERVING, PRODUCTION, "reads an environment variable: a switch "
                         "production sets when it deploys")]
    if any(switches_collective(name) for name in _QUOTED_NAME.findall(line.raw)):
        hits.append((SYNC, CONCURRENCY, "reads a switch of a collective library (which "
                     "communicator and stream collectives use)"))
    return hits


def _is_switch_value(code: str, start: int) -> bool:
    """Whether the read at ``start`` is the value an assignment gives its name (``flag =
    int(os.getenv("X", "0")) == 1``), not an argument of another call (``mp.get_context(
    os.getenv("MP_METHOD", "fork"))``, which the call's own rule reads)."""
    depth = 0
    for i in range(start - 1, -1, -1):
        ch = code[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            if depth:
                depth -= 1
                continue
            name = re.search(r"[\w.]*$", code[:i])
            if name is None or name.group() not in ("", "int", "bool", "float", "str", "not"):
                return False
        elif ch == "=" and depth == 0 and code[i - 1:i] not in ("=", "!", "<", ">") and (
                code[i + 1:i + 2] != "="):
            return True
    return False


def _untouched_reads(line: _Line, elsewhere: str) -> bool:
    """Whether a build recipe's line changed only where it is laid out or where it reads an
    environment variable the other side of the file read too (``elsewhere``: a read moved
    from a function to the module). A read's default is in a string: it is read with it."""
    if _untouched(line.code, line) and _untouched_raw(line.raw, line):
        return True
    reads = [_call_text(line.raw, m.start()) for m in _ENV_READ.finditer(line.raw)]
    if not reads or any(_squash(read) not in elsewhere for read in reads):
        return False
    rest = line.raw
    for read in reads:
        rest = rest.replace(read, "")
    return not _BUILD_LINE.search(rest)


def _file_sides(change: FileChange, lexer: Callable[[Sequence[str]], list[Lexed]],
                ) -> dict[str, str]:
    """Each side's changed lines of the whole file, comments blanked, without layout."""
    out: dict[str, list[str]] = {ADDED: [], REMOVED: []}
    for hunk in change.hunks:
        for line, lexed in zip(hunk.lines, lexer([line.text for line in hunk.lines]),
                               strict=True):
            if line.kind != CONTEXT:
                out[line.kind].append(_squash(lexed.raw))
    return {kind: "\n".join(texts) for kind, texts in out.items()}


def _new_call(pattern: re.Pattern[str], line: _Line) -> bool:
    """Whether a call ``pattern`` matches, with its arguments, is missing on the other side:
    std::mt19937(0) -> std::mt19937(j) is a new call, a call moved as it was is not."""
    return any(not _untouched_raw(_call_text(line.raw, m.start()), line)
               for m in pattern.finditer(line.code))


def _call_text(text: str, start: int) -> str:
    """The call starting at ``start`` up to its closing bracket (the rest of the line if it
    does not close there)."""
    opened = re.search(r"[({\[]", text[start:])
    if opened is None:
        return text[start:]
    depth, i = 0, start + opened.start()
    while i < len(text):
        depth += {"(": 1, "{": 1, "[": 1, ")": -1, "}": -1, "]": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            break
    return text[start:i]


def _untouched_raw(text: str, line: _Line) -> bool:
    """``_untouched`` on the lines with their strings (a string's contents are the change)."""
    return " ".join(text.split()) in line.raw_other or _squash(text) in line.raw_other


def _assigned_anew(name: str, line: _Line, values: re.Pattern[str],
                   ignored: re.Pattern[str] | None = None) -> bool:
    """Whether the other side assigns ``name`` too, with other ``values`` (literals);
    ``ignored``: what is not a value (an environment read: the switch is made settable, its
    default is read with it)."""
    there = re.search(rf"(?m)^.*\b{re.escape(name)}\b\s*(?::[^=\n]*)?=(?!=)(.*)$",
                      line.raw_other)
    here = line.raw[line.raw.find(name) + len(name):]
    if there is None:
        return False
    other = there.group(1)
    if ignored is not None and (ignored.search(here) or ignored.search(other)):
        here, other = ignored.sub(" ", here), ignored.sub(" ", other)
        if not values.search(other):
            return False  # its value became (or was) the environment's, with a default
    return values.findall(other) != values.findall(here) and bool(values.search(here))


# An environment read with its name and default: what makes a switch settable, not its value.
_ENV_VALUE = re.compile(r"""(?:(?:\bos\.environ\.get|\bos\.getenv|\bgetenv|"""
                        r"""\b\w*(?:env|Env|ENV)\w*)\s*\([^()]*\)|["'][A-Z][A-Z0-9_]{2,}["']\s+(?:not\s+)?in\s+os\.environ)"""
                        r"""(?:\s*\)?\s*(?:==|!=|in)\s*(?:["'][^"']*["']|\d+|True|False|"""
                        r"""\([^()]*\)))?""")


def _words_of(name: str) -> list[str]:
    return [word.lower() for word in _WORDS.findall(name)]


_CONDITION_WORDS = frozenset({"if", "elif", "else", "while", "not", "and", "or", "is", "in",
                              "None", "True", "False"})


def _guards_precision(lines: Sequence[_Line], i: int, python: bool,
                      options: frozenset[str] = frozenset()) -> bool:
    """Whether line ``i`` changes a condition (its logic or values, not its names: ``or`` ->
    ``and``) whose text or body (the next lines of its side) converts a precision, casts or
    quantises. The line is the ``if`` or one its brackets run over. A condition over an
    option the diff removes (``options``: ``if not use_sdpa:`` where ``use_sdpa=False`` goes)
    that its default made true is not one: its branch is what callers that never passed the
    option ran, and those that did now fail."""
    line = lines[i]
    if _untouched(line.code, line) or not _logic_differs(line):
        return False
    side = [k for k, other in enumerate(lines) if other.kind in (CONTEXT, line.kind)]
    at = side.index(i)
    header = next((k for k in reversed(side[max(0, at - 4):at + 1])
                   if _CONDITION.match(lines[k].code)), None)
    if header is None or (header != i and sum(
            lines[k].code.count("(") - lines[k].code.count(")")
            for k in side[side.index(header):at]) <= 0):
        return False  # not in the condition's brackets: another statement
    if options and _default_branch(lines[header].code, options):
        return False  # an option the diff removes, its default branch kept (see above)
    # A buffer allocated in a dtype names its elements' type: no value is converted.
    block = [lines[k].code for k in side[side.index(header):at + 5] if lines[k].code.strip()
             and (k == header or "32" not in lines[k].code or not _ALLOCATION.search(
                 lines[k].code))]
    signatures = _PYTHON_SET if python else _NATIVE_SET
    return any(signature.rule == PRECISION and not signature.weak
               for text in block for signature, *_ in signatures.matches(text))


def _logic_differs(line: _Line) -> bool:
    """Whether the line's logic or literals differ from its counterpart's (``or`` -> ``and``,
    ``<`` -> ``<=``, ``False`` -> ``True``, a number); True when it has no counterpart."""
    other = line.twin if line.twin is not None else line.kin
    if other is None:
        return True
    return (_LOGIC_TOKEN.findall(other) != _LOGIC_TOKEN.findall(line.code)
            or _NUMBER.findall(other) != _NUMBER.findall(line.code))


def _assigned(code: str) -> str | None:
    match = _TARGET.match(code)
    return (match.group(1) or match.group(2)) if match else None


def _target_words(line: _Line) -> frozenset[str]:
    """The words of the name a changed line assigns or #defines, when its value changed (a
    new assignment with a number, or the other side assigns the name another value)."""
    name = line.target
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


def _is_build_recipe(change: FileChange, text: str) -> bool:
    """A project's root setup.py, or a file that calls setuptools or torch's extension
    builders (serve/setup.py, which sets a process up, is not one)."""
    return change.path == "setup.py" or bool(_BUILD_FILE.search(text))


def _holds_device_code(change: FileChange, language: str | None, text: str) -> bool:
    """CUDA or HIP source, a shader, a file whose diff (``text``) shows device code, or
    Python written in a kernel language (Triton, CuTe, TileLang)."""
    if language in (files.PYTHON, files.CYTHON):
        return bool(_KERNEL_DSL.search(text))
    return language == files.SHADER or change.path.endswith(_DEVICE_SUFFIXES) or bool(
        _DEVICE_MARK.search(text))


def _diff_text(change: FileChange) -> str:
    """Every line of the file's diff and the hunk headers' functions, as one text: one search
    over it costs less than one per line."""
    return "\n".join([line.text for hunk in change.hunks for line in hunk.lines] + [
        hunk.section for hunk in change.hunks])


def _test_hits(line: _Line, added: str = "") -> list[_Hit]:
    """A test changes what passes: a tolerance loosened or a seed changed lets a numerics
    change through; a new test or a tighter tolerance does not. A tolerance is known by a name
    with a word tol, atol, rtol or eps (``abs_tol``, ``fwd_atol``) or by its place: a fraction
    in a row of bare numbers (a parametrised test's table, whose columns have no names)."""
    hits: list[_Hit] = []
    named = bool(_TOLERANCE.search(line.code) or _TOLERANCE_WORD.search(line.code) or (
        set(_words_of(line.opened)) & _TOLERANCE_WORDS))  # a row of `tols = {`
    row = bool(_NUMBER_ROW.match(line.code))
    if line.twin is not None and (named or row) and _loosened(line, fractions=not named):
        hits.append((PRECISION, NUMERICS, "loosens a tolerance in a test: what used to fail "
                     "now passes"))
    elif _rewrites_tolerance(line):
        hits.append((PRECISION, NUMERICS, "rewrites a tolerance in a test (another name or "
                     "formula): what passes may change, a reviewer compares"))
    elif _relaxes_comparison(line, added):
        hits.append((PRECISION, NUMERICS, "relaxes a comparison in a test (an exact check made "
                     "approximate, or given a tolerance it did not have): what used to fail now "
                     "passes"))
    elif _bounds_exact_check(line):
        hits.append((PRECISION, NUMERICS, "turns an exact check in a test into a bound (a "
                     "difference within a slack, a NEAR check): what used to fail now passes"))
    elif _sets_tolerance(line, added):
        hits.append((PRECISION, NUMERICS, "sets a tolerance for comparisons the change does not "
                     "add (under a condition, for one dtype): what used to fail may now pass"))
    if _new(_TEST_PRECISION, line):
        hits.append((PRECISION, NUMERICS, "changes the precision a test computes under (TF32 "
                     "turned off or on, a matmul precision): what its tolerances must allow"))
    if (_SEED.search(line.code) and _numbers_differ(line)) or _new(_SEED_CALL, line):
        hits.append((PRECISION, NUMERICS, "changes the seed a test compares results under"))
    if _new(_TEST_SYNC, line):
        hits.append((SYNC, CONCURRENCY, "changes how a test's ranks or streams wait for each "
                     "other (a synchronize or a barrier in its set-up or teardown): a "
                     "distributed suite that hangs or reads unfinished work"))
    return hits


# A test's precision mode: TF32 switched for a block, a matmul precision set.
_TEST_PRECISION = re.compile(r"\b(?:tf32_off|tf32_on|tf32_on_and_off|with_tf32_off|allow_tf32|"
                             r"set_float32_matmul_precision|allow_(?:fp16|bf16)_reduced_precision"
                             r"_reduction)\b")
# Synchronisation in a test's harness: the device, a stream or the ranks of a distributed test.
_TEST_SYNC = re.compile(r"\b(?:torch\.cuda\.synchronize|(?:dist|torch\.distributed)\.barrier|"
                        r"\w+\.wait_stream|get_accelerator\(\)\.synchronize)\s*\(")


def _sets_tolerance(line: _Line, added: str) -> bool:
    """A new line that sets tolerance values (``tols = dict(rtol=2e-2, atol=1e-2)``) where the
    file's change adds no comparison: the tolerance loosens (or replaces) one of comparisons
    already there."""
    return line.kind == ADDED and line.twin is None and line.kin is None and bool(
        (_TOLERANCE_ARGUMENT.search(line.code) or (
            line.target and set(_words_of(line.target)) & _TOLERANCE_WORDS))
        and _NUMBER.search(line.code)) and not _COMPARISON.search(added)


def _config_hits(line: _Line) -> list[_Hit]:
    if not _CONFIG_DTYPE.search(line.text) or line.text.strip() in line.other:
        return []
    return [(PRECISION, NUMERICS, "changes a dtype or precision in a config file"),
            (SERVING, PRODUCTION, "changes the dtype or precision a deployment runs with")]


def _loosened(line: _Line, *, fractions: bool = False) -> bool:
    """Whether the added side of the line allows more than the removed side: a larger number
    in the same place (the removed line of a loosening is flagged with it). ``fractions``:
    only a number below 1 that grows (a tolerance in a row of bare numbers, among sizes)."""
    here = [_value(m) for m in _NUMBER.findall(line.code)]
    there = [_value(m) for m in _NUMBER.findall(line.twin or line.kin or "")]
    new, old = (here, there) if line.kind == ADDED else (there, here)
    return any(a > b and (not fractions or 0 < b < 1) for a, b in zip(new, old, strict=False))


def _relaxes_comparison(line: _Line, added: str) -> bool:
    """A comparison that gains tolerance arguments (``assert_close(a, b)`` -> ``assert_close(
    a, b, atol=atol)``), or an exact comparison (``torch.equal``) removed where the file's
    change (``added``: its added lines) compares with a tolerance."""
    if line.kind == ADDED:
        return bool(_COMPARISON.search(line.code) and _TOLERANCE_ARGUMENT.search(line.code)
                    and _COMPARISON.search(line.other)
                    and not _TOLERANCE_ARGUMENT.search(line.other))
    return bool(_EXACT.search(line.code) and not _untouched(line.code, line) and (
        _COMPARISON.search(added) or _TOLERANCE_ARGUMENT.search(added)))


def _rewrites_tolerance(line: _Line) -> bool:
    """A tolerance assigned anew where the other side assigned one under another name or
    formula (``abs_tol = 1e-4`` -> ``fwd_atol = 2 * err``): not a tightening with the same
    form, which ``_loosened`` judges."""
    name = line.target
    if name is None or not set(_words_of(name)) & _TOLERANCE_WORDS or _untouched(line.code,
                                                                                  line):
        return False
    if line.twin is not None or line.kin is not None:
        return _loosened(line)
    return any(set(_words_of(other)) & _TOLERANCE_WORDS
               for names in _ASSIGNED_NAME.findall(line.other) for other in names.split(","))


def _value(text: str) -> float:
    try:
        return float(text.rstrip("uUlLfF")) if not text.lower().startswith("0x") else float(
            int(text, 16))
    except ValueError:
        return 0.0


def _changes_a_value(line: _Line) -> bool:
    """Whether a changed code line changes a number, a boolean, its logic (``and`` -> ``or``,
    ``<`` -> ``<=``), a dtype or a call's arguments: a line whose change lies only in strings
    (log text), comments or names (a rename) does not, nor a line moved within the hunk."""
    code = line.code
    if not code.strip() or _LOG_OR_RAISE.match(code) or _DEF.match(code):
        return False
    if _untouched(code, line):
        return False
    if line.kin is not None:
        return _numbers_differ(line) or _logic_differs(line)
    return bool(_VALUE.search(code)) or any(
        f"{m.group(1)}(" in line.other for m in _CALL.finditer(code))  # other arguments


def _holds_risky_code(change: FileChange, text: str) -> bool:
    return bool(_RISKY_PATH.search(change.path) or _RISKY_CODE.search(text))


def _distinct(hits: list[_Hit]) -> list[_Hit]:
    """The first hit of each rule: a finding is one per rule and line."""
    return list({hit[0]: hit for hit in reversed(hits)}.values())[::-1]


# A line that defines one new name: an enumerator (``kReady = 4,``), a constant, a #define.
_DEFINES = re.compile(r"^\s*(?:#\s*define\s+|(?:(?:static|constexpr|const|inline|auto|int|"
                      r"unsigned|[A-Za-z_][\w:<>]*_t)\s+)*)([A-Za-z_]\w*)\s*(?:=\s*[^=,;]+)?[,;]?\s*$")


def judged_where_used(findings: list[Finding]) -> list[Finding]:
    """The diff's findings without the fail-closed ones that only define a new name which a
    flagged line of another file uses (a barrier's new id in an enum, the barrier in the
    kernel): the name's value is reviewed where it is used."""
    unsure = [f for f in findings if f.rule == UNSURE and f.side == ADDED]
    if not unsure:
        return findings
    used: dict[str, set[str]] = {}
    for f in findings:
        if f.rule != UNSURE and f.line is not None:
            for name in _NAME.findall(f.text):
                used.setdefault(name, set()).add(f.path)
    dropped = set()
    for f in unsure:
        match = _DEFINES.match(f.text)
        if match and used.get(match.group(1), set()) - {f.path}:
            dropped.add(id(f))
    return [f for f in findings if id(f) not in dropped]


# --- Fourth round (issue 27, the third held-out set) -----------------------------------------

def _fourth_round_hits(line: _Line, order: Order, kind: _File,
                       families: Families) -> list[_Hit]:
    """The fourth round's families on one changed line of code (see docs/risk.md):
    communicators split or created, streams re-owned, host thread counts, layouts and
    number-format functions in kernel code, TIR statements, serving limits and network
    timeouts, a launcher's literals, a preset's defaults, environment switches read through a
    project's helper, a sort in distributed plumbing."""
    code = line.code
    if not code.strip() or _untouched(code, line) or _LOG_OR_RAISE.match(code):
        return []
    hits: list[_Hit] = []
    renamed = line.kin is not None and not _numbers_differ(line) and not _logic_differs(line)
    name = line.target
    words = set(_words_of(name)) if name else set()
    if _COMMUNICATOR_HINT.search(code) and _new_call(_COMMUNICATOR, line):
        hits.append((SYNC, CONCURRENCY, "splits, duplicates or creates a communicator or "
                     "process group: which ranks meet in a collective, and who else issues "
                     "work on it"))
    if words & _STREAM_WORDS and not renamed and not _DEF.match(code):
        hits.append((SYNC, CONCURRENCY, f"changes which stream, event or communicator "
                     f"{name} is: who shares it, and so what waits for what"))
    if not kind.device and not renamed and _THREAD_HINT.search(code) and not _DEF.match(
            code) and any(
            set(_words_of(other)) & _WORKER_WORDS and not re.search(rf"\b{other}\b", line.other)
            for other in _ARGUMENT_NAME.findall(code)):
        hits.append((THREADS, CONCURRENCY, "changes how many host threads or workers run (a "
                     "count passed or dropped): what runs concurrently"))
    if kind.device and words & _LAYOUT_WORDS and not renamed:
        hits.append((PRECISION, NUMERICS, f"changes a stride or leading dimension ({name}): "
                     "which elements a kernel reads and combines"))
    returned = _RETURNS.search(code)
    if returned and set(_words_of(returned.group(1))) & _FORMAT_WORDS and _numbers_differ(
            line):
        hits.append((PRECISION, NUMERICS, f"changes what {returned.group(1)}() returns: a "
                     "number format's limit or epsilon"))
    if line.opened and set(_words_of(line.opened)) & _FORMAT_WORDS and _numbers_differ(line):
        hits.append((PRECISION, NUMERICS, f"changes a row of {line.opened}: a tolerance, scale "
                     "or epsilon of library code"))
    if kind.tir and kind.unseen_kernel and not renamed and _TIR_CALL.search(code):
        hits.append((KERNEL, NUMERICS, "changes a TIR statement (T.*) of a kernel: what it "
                     "reads, computes or writes"))
    if not renamed and ((name and _SERVING_LIMIT.search(name) and _value_changed(name, line))
                        or (line.opened and _SERVING_LIMIT.search(line.opened)
                            and _NUMBER.search(code) and line.twin is None)):
        hits.append((SERVING, PRODUCTION, f"changes a serving limit ({name or line.opened}): "
                     "how production batches and schedules requests"))
    if _NETWORK_TIMEOUT.search(code):
        families.give_way([order], THREADS)
        hits.append((SERVING, PRODUCTION, "changes a timeout of the HTTP layer (a client, a "
                     "proxy, a keep-alive): a serving setting"))
    if kind.launcher and kind.python and not renamed and not _DEF.match(code) and _new_literal(
            line):
        hits.append((LAUNCH, PRODUCTION, "changes a literal of the launcher (a flag, a "
                     "default, how a command or its environment is written): how production "
                     "starts"))
    if kind.defaults and name and _assigned_anew(name, line, _DEFAULT_VALUE):
        hits.append((SERVING, PRODUCTION, f"changes a preset the service is built or started "
                     f"with ({name})"))
    helper = _ENV_HELPER.search(line.raw) if "nv" in line.raw or "NV" in line.raw else None
    if helper and not kind.build and helper.group(1) not in line.raw_other:
        hits.append((SERVING, PRODUCTION, f"reads {helper.group(1)}: a switch production sets "
                     "when it deploys"))
    if kind.distributed and _new(_SORTS, line):
        families.explained.add(order)
        hits.append((SYNC, CONCURRENCY, "changes the order work is issued in, in distributed "
                     "code: ranks that issue collectives in different orders hang"))
    return hits


_DEFAULT_VALUE = re.compile(f"{_LITERAL.pattern}|{_ENUM_VALUE.pattern}")
_STRING = re.compile(r"""[rfbuRFBU]*(?:"[^"\n]*"|'[^'\n]*')""")
_HELP = re.compile(r"""\b(?:help|description|epilog|usage)\s*=\s*[rfbu]*(["']).*?\1""")


def _value_changed(name: str, line: _Line) -> bool:
    """Whether the line gives ``name`` a number the other side did not: another number, or a
    new assignment with one."""
    there = re.search(rf"(?m)^.*\b{re.escape(name)}\b\s*(?::[^=\n]*)?=(?!=)(.*)$",
                      line.raw_other)
    here = line.raw[line.raw.find(name) + len(name):]
    if there is None:
        return bool(_NUMBER.search(line.code[line.code.find(name) + len(name):]))
    return _NUMBER.findall(there.group(1)) != _NUMBER.findall(here)


def _new_literal(line: _Line) -> bool:
    """Whether the line holds a string the other side lacks (a flag, a command's piece, a
    value quoted anew); help text is not one."""
    raw = _HELP.sub("", line.raw)
    return any(not _untouched_raw(m.group(), line) for m in _STRING.finditer(raw))


def _fourth_round_runs(lines: Sequence[_Line], h: int, kind: _File,
                       families: Families) -> Iterator[tuple[int, _Hit]]:
    """The fourth round's families over a hunk's lines (see docs/risk.md): a condition put
    over a wait in kernel code, a condition over a collective or a stream step, what a
    collective sends prepared anew, a pinned staging buffer; and what changes nothing of the
    analysers' rules: a barrier's arguments respelled, a copy rewritten in the same
    precision, a kernel parameter's ``tl.constexpr``, a collective's argument extracted into
    the name the function goes on to use (the value it returns changes, not the collective)."""
    text = "\n".join(line.code for line in lines)
    sent = {m.group(1) for line in lines if line.kind == CONTEXT
            for m in _SENT.finditer(line.code)} if kind.python and "(" in text else set()
    pinned = kind.python and ("pin" in text or "non_blocking" in text)
    # Most hunks hold no condition, no collective's argument and no pinned buffer.
    scanned = lines if _CONDITION_HINT.search(text) or sent or pinned else ()
    for i, line in enumerate(scanned):
        if line.kind == CONTEXT or not line.code.strip() or _untouched(line.code, line):
            continue
        block = [lines[k].code for k in range(i + 1, min(len(lines), i + 4))
                 if lines[k].kind in (CONTEXT, line.kind) and lines[k].code.strip()][:2]
        condition = bool(_CONDITION.match(line.code)) and _logic_differs(line)
        if condition and kind.device and any(
                _SYNC_HINT.search(later) and _SYNC_CALL.search(later) for later in block):
            families.explained.add((h, i))
            yield i, (SYNC, CONCURRENCY, "puts a condition over a barrier, wait or arrival: "
                      "which threads wait, and whether a peer's arrival is missed")
        elif condition and kind.python and not kind.device and any(
                _COLLECTIVE.search(later) for later in block):
            families.explained.add((h, i))
            yield i, (SYNC, CONCURRENCY, "changes the condition over a collective or a stream "
                      "step: which ranks or streams meet, and when")
        bound = _BINDS.match(line.code)
        if kind.python and bound and bound.group(1) in sent:
            yield i, (SYNC, CONCURRENCY, f"changes {bound.group(1)}, which a collective sends: "
                      "its shape must agree on every rank, or the ranks hang")
        if pinned and "pin" in line.code and _PINNED.search(line.code):
            run = _statement(lines, i)
            families.explained.update((h, k) for k in run)
            yield i, (SYNC, CONCURRENCY, "allocates or drops a pinned host buffer: which copies "
                      "run asynchronously, and where the host must wait for them")
    if _WARP_SYNC_HINT.search(text):
        families.give_way(((h, i) for i in _respelled_barriers(lines)), SYNC)
    if pinned:
        families.give_way(((h, i) for i in _same_precision_copies(lines)), PRECISION)
    if "constexpr" in text:
        families.give_way(((h, i) for i in _constexpr_hints(lines)), KERNEL, ACCUMULATION)
    for i, kept in _kept_results(lines) if kind.python and _COLLECTIVE.search(text) else ():
        families.give_way([(h, i)], SYNC)
        if kept:
            yield i, (ACCUMULATION, NUMERICS, "rebinds a collective's argument to the name the "
                      "code goes on to use: which value callers get back (the reduced tensor "
                      "or an unreduced copy)")


def _statement(lines: Sequence[_Line], i: int) -> list[int]:
    """Line ``i`` and the lines of its side its open brackets run over."""
    out, depth = [i], lines[i].code.count("(") - lines[i].code.count(")")
    for k in range(i + 1, len(lines)):
        if depth <= 0:
            break
        if lines[k].kind == lines[i].kind:
            out.append(k)
            depth += lines[k].code.count("(") - lines[k].code.count(")")
    return out


def _call_of(lines: Sequence[_Line], i: int) -> str:
    """The call that starts on line ``i``, with the lines of its side it runs over, with its
    strings and without layout."""
    return "".join("".join(lines[k].raw.split()) for k in _statement(lines, i))


def _arguments(call: str) -> list[tuple[str, str]] | None:
    """A plain call's arguments as (keyword, value), None if it is not one (quotes or
    brackets inside): ``fence_proxy(ProxyKind.async_shared, space=SharedSpace.shared_cta)``
    gives ("", "ProxyKind.async_shared") and ("space", "SharedSpace.shared_cta")."""
    inner = call[call.find("(") + 1:call.rfind(")")]
    parts = [part for part in inner.split(",") if part]
    if any(part.count('"') % 2 or part.count("'") % 2 or re.search(r"[()\[\]{}]", part)
           for part in parts):
        return None
    return [(keyword, value) for part in parts
            for keyword, _, value in [part.rpartition("=")]]


def _same_argument(old: str, new: str) -> bool:
    """Whether two spellings name one value: equal, or an enum member and its string (the
    string's words are the member's last words: ``ProxyKind.async_shared`` and
    ``"async.shared"``, ``SharedSpace.shared_cta`` and ``"cta"``)."""
    if old == new:
        return True
    member = re.fullmatch(r"(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)", old)
    string = re.fullmatch(r"[\"']([^\"']*)[\"']", new)
    if not (member and string and string.group(1)):
        return False
    words = re.sub(r"\W", "_", string.group(1))
    return member.group(1) == words or member.group(1).endswith("_" + words)


def _respelled_barriers(lines: Sequence[_Line]) -> list[int]:
    """The lines of a barrier or fence call rewritten with the same arguments spelled anew
    (an enum member as its string, in the newer API)."""
    out: list[int] = []
    starts = {kind: [i for i, line in enumerate(lines) if line.kind == kind and
                     _WARP_SYNC.search(line.code) and _PLAIN_CALL.match(line.code)]
              for kind in (REMOVED, ADDED)}
    for i in starts[REMOVED]:
        old = _call_of(lines, i)
        for j in starts[ADDED]:
            new = _call_of(lines, j)
            before, after = _arguments(old), _arguments(new)
            if old == new or old[:old.find("(")] != new[:new.find("(")] or (
                    before is None or after is None):  # a barrier moved: not respelled
                continue
            if len(before) == len(after) and all(
                    a[0] == b[0] and _same_argument(a[1], b[1])
                    for a, b in zip(before, after, strict=True)):
                out += _statement(lines, i) + _statement(lines, j)
    return out


_PLAIN_CALL = re.compile(r"^\s*[\w.]+\(")


def _precisions(text: str) -> set[str]:
    return {name for name, pattern in _PRECISIONS if pattern.search(text)}


def _same_precision_copies(lines: Sequence[_Line]) -> list[int]:
    """The lines of a run that changes a non-blocking or pinned copy, where both sides of the
    run name the same precisions (``.to(dtype=torch.float32, non_blocking=True)`` ->
    ``.float()``): the copy's ordering changed, not what it rounds to."""
    out: list[int] = []
    start = 0
    for end in range(len(lines) + 1):
        if end < len(lines) and lines[end].kind != CONTEXT:
            continue
        run = range(start, end)
        start = end + 1
        sides = {kind: " ".join(lines[k].code for k in run if lines[k].kind == kind)
                 for kind in (REMOVED, ADDED)}
        if not any(_PINNED.search(text) for text in sides.values()):
            continue
        if _precisions(sides[REMOVED]) == _precisions(sides[ADDED]) != set():
            out += list(run)
    return out


_CONSTEXPR = re.compile(r":\s*tl\.constexpr\b")


def _constexpr_hints(lines: Sequence[_Line]) -> list[int]:
    """Kernel parameters that only gain or lose ``: tl.constexpr``: how Triton specialises
    (and recompiles) the kernel, not the values it computes with."""
    out = []
    for i, line in enumerate(lines):
        if line.kind != CONTEXT and _CONSTEXPR.search(line.code):
            bare = _squash(_CONSTEXPR.sub("", line.code))
            if re.search(rf"(?m)^{re.escape(bare)},?$", "\n".join(
                    _squash(other.code) for other in lines
                    if other.kind not in (CONTEXT, line.kind))):
                out += [i] + [k for k, other in enumerate(lines)
                              if other.kind not in (CONTEXT, line.kind)
                              and _squash(other.code).rstrip(",") == bare.rstrip(",")]
    return out


def _kept_results(lines: Sequence[_Line]) -> list[tuple[int, bool]]:
    """A collective whose argument expression was extracted into a rebinding of the name it
    reads (``all_reduce(x.contiguous())`` -> ``x = x.contiguous(); all_reduce(x)``): the
    collective's call is the same, its lines give way (False); the rebinding is what changed,
    the value the code goes on to use (True)."""
    out: list[tuple[int, bool]] = []
    bindings = {m.group(1): (i, m.group(2)) for i, line in enumerate(lines)
                if line.kind == ADDED
                for m in [re.match(r"^\s*(\w+)\s*=(?!=)\s*(.+?)\s*$", line.code)] if m}
    removed = [(i, _squash(line.code)) for i, line in enumerate(lines) if line.kind == REMOVED]
    for j, line in enumerate(lines):
        if line.kind != ADDED or not _COLLECTIVE.search(line.code):
            continue
        for name, (i, value) in bindings.items():
            if i == j or not re.search(rf"\b{re.escape(name)}\b", value):
                continue
            inlined = re.sub(rf"\b{re.escape(name)}\b", _squash(value).replace("\\", r"\\"),
                             _squash(line.code))
            for k, text in removed:
                if text == inlined:
                    out += [(j, False), (k, False), (i, True)]
    return out


# --- Sixth round (issue 27, the fifth held-out set) ------------------------------------------
# An integer width or cast in kernel code: where an index, offset or counter overflows or
# wraps (`(size_t)idx.b * depth()`, `static_cast<int64_t>(`, CuTe's `Int64(m) * Int64(4)`,
# `(counter >> Uint64(32)).to(Uint32)`). Not `sizeof(int)`.
_INT_TYPE = (r"(?:const\s+)?(?:unsigned\s+)?(?:u?int(?:8|16|32|64)_t|size_t|ssize_t|ptrdiff_t|"
             r"index_t|long\s+long|long|int64|uint64|int)")
_INT_WIDTH = re.compile(rf"\((?<!sizeof\()(?<!sizeof \()\s*{_INT_TYPE}\s*\)(?=\s*[\w(])|"
                        rf"\bstatic_cast<\s*{_INT_TYPE}\s*>|"
                        # a brace or functional cast (seventh round): `unsigned{sizeof(T)}`,
                        # `int64_t(n)`, `size_t{k}`
                        r"\b(?:unsigned|signed|int|long|size_t|ssize_t|ptrdiff_t|u?int(?:8|16|32|64)_t)"
                        r"\s*\{(?=[^{}]*\})|\b(?:size_t|ssize_t|ptrdiff_t|u?int(?:8|16|32|64)_t)\s*\((?!\s*\))|"
                        r"\b(?:Int|Uint|UInt)(?:8|16|32|64)\s*\(|"
                        r"\.to\(\s*(?:cutlass\.)?(?:Int|Uint|UInt)(?:8|16|32|64)\s*\)")
# A flag, signal or semaphore in memory that blocks or GPUs poll: which of them waits for which
# (`d_flag_color[blockIdx.x] = flag_color`, `uint32_t* d_flag_color`, `*sem_ptr`).
_FLAG_WORDS = frozenset({"flag", "flags", "signal", "signals", "sem", "sems", "semaphore",
                         "semaphores", "doorbell"})
_IN_MEMORY = re.compile(r"\*\s*([A-Za-z_]\w*)|\b([A-Za-z_]\w*)\s*(?:\[|->)")
_COMMUNICATION_PATH = re.compile(r"(?i)all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|"
                                 r"collective|comm|nccl|rccl|nvshmem|mscclpp|ipc|p2p|custom_ar|"
                                 r"symm|multimem|barrier|sync")
_ORDERED_MEMORY = re.compile(r"\batomic\w*|__threadfence|\bvolatile\b|\bld\.acquire|"
                             r"\bst\.release|memory_order")
# A collective called by its name, in a project's spelling (`tp_gather(ctx, x, buf)`,
# `custom_all_reduce(...)`, ThunderKittens' `multimem<bf16_2>::ld_reduce<OP>(...)`): what it
# sends or receives, into which buffer, which ranks meet.
_COLLECTIVE_CALL = re.compile(
    r"\b(?!(?:get|is|use|has|should|enable)_\w+\s*\(\s*\))(?:(?:tp|dp|pp|ep|cp|sp|mp)_\w*(?:gather|reduce|broadcast|scatter|all_?to_?all|send|"
    r"recv)\w*|(?![\w]*(?:warp|Warp|WARP|block|Block|BLOCK|cta|wave|lane|simd|subgroup))"
    r"\w*(?:all_?gather|all_?reduce|reduce_?scatter|all_?to_?all|AllGather|AllReduce|"
    r"ReduceScatter)\w*)\s*(?:<[^<>()]*>)?\s*\(|\bmultimem\s*<[^<>()]*>\s*::\s*\w+")
# The dimension a tensor operation works along: `torch.roll(k, shifts=-n, dims=3)` -> `dims=2`,
# `.transpose(1, 2)` -> `.transpose(2, 3)`: which elements it moves or combines.
_DIM_KEYWORD = re.compile(r"(?<![\w.])(?:dim|dims|axis|axes|shifts|start_dim|end_dim)\s*=(?!=)")
_LAYOUT_CALL = re.compile(r"\.(?:transpose|permute|movedim|moveaxis|swapaxes|swapdims|flip|roll|"
                          r"unsqueeze|squeeze|flatten|unflatten)\s*\(")
# Environment reads through a project's helper, template arguments included
# (`readEnv<int>("MSCCLPP_IB_GID_INDEX", 0)`), and membership (`'X' in os.environ`).
_ENV_MEMBER = re.compile(r"""["'][A-Z][A-Z0-9_]{2,}["']\s+(?:not\s+)?in\s+os\.environ\b""")
# Text a launcher's argument carries: help, usage, a description; not a default.
_TEXT_KEYWORDS = frozenset({"help", "description", "epilog", "usage", "metavar", "title",
                            "doc", "msg", "message", "prog"})
# A branch that only answers a question (a size in bytes, whether a type is supported):
# `return 1`, `return True`, `raise ...` (not `continue`: which items a loop converts).
_CONSTANT_BODY = re.compile(r"^\s*(?:return\s+(?:[-+]?[\d.]+(?:\s*/\s*[\d.]+)?|True|False|None)"
                            r"\s*$|raise\b)")
_DTYPE_TEST = re.compile(r"\bdtype\b|\b(?:torch|np|numpy|tl)\.\w*(?:float|int|bf16|fp8|half)\w*")
# A typed constant in a kernel DSL (`Float32(1.0)`, `Int32(0)`): a literal, not a cast.
_TYPED_CONSTANT = re.compile(r"\b(?:[BT]?[Ff]loat|[Uu]?[Ii]nt|UInt|Half|BFloat)\d*\(\s*[-+]?\d+"
                             r"(?:\.\d*)?(?:[eE][-+]?\d+)?\s*\)")
# A scratch buffer allocated in FP32 names its elements' type; it rounds nothing (one in a
# reduced precision does: it is read as before).
_ALLOCATION = re.compile(r"\b(?:alloc\w*|allocate\w*|empty\w*|zeros\w*|ones\w*|full\w*|"
                         r"make_\w*tensor\w*|make_fragment\w*|make_rmem\w*|new_\w+)\s*\("
                         r"(?=.*\b(?:[Ff]loat32|fp32|f32)\b)(?!.*\b(?:[Bb]?[Ff]loat16|fp16|bf16|"
                         r"f16|[Hh]alf|fp8|\w*[Ff]loat8\w*|int8|int4)\b)")
# A preprocessor condition and the directives that close or switch its block.
_DIRECTIVE_IF = re.compile(r"^\s*#\s*(?:if|ifdef|ifndef|elif)\b")
_DIRECTIVE_OPEN = re.compile(r"^\s*#\s*if")
_DIRECTIVE_END = re.compile(r"^\s*#\s*endif\b")
# How wide a warp or wavefront is: what a shuffle's lanes and a warp's barrier assume.
_WARP_WIDTH = re.compile(r"(?i)warp_?size|wave_?size|wavefront|warp_?width|\bWARP_THREADS\b")
_DEFINED_MACRO = re.compile(r"^\s*#\s*define\s+(\w+)")
# A struct or class named as a synchronisation primitive (DeviceSyncer, DeviceSemaphore,
# GridBarrier): its code is how threads and blocks wait for each other.
_SYNC_PRIMITIVE_WORDS = frozenset({"sync", "syncer", "syncers", "barrier", "barriers",
                                   "semaphore", "semaphores", "mutex", "spinlock", "fence",
                                   "fences"})
_SECTION_NAME = re.compile(r"^\s*(?:template\s*<.*>\s*)?(?:typedef\s+)?(?:struct|class|union)\s+"
                           r"(?:\w+\s+)*?(\w+)\s*(?:[:{]|$)")
# A file whose name says what its code decides: synchronisation (thread_storage_sync.cc, a
# pass that places barriers) or a number format (a quantiser, a norm). Where nothing else is
# found, its changed values are that class, not unclassified.
_SYNC_FILE_WORDS = frozenset({"sync", "barrier", "barriers", "fence", "fences", "atomic",
                              "atomics", "semaphore", "mutex", "lock", "locks"})
_NUMERIC_FILE_WORDS = frozenset({"quant", "quantize", "quantizer", "quantization", "dequant",
                                 "dequantize", "norm", "layernorm", "rmsnorm", "softmax",
                                 "rounding", "precision"})
# A build recipe's condition: which extensions it builds, for which platform or toolkit.
_BUILD_CONDITION = re.compile(r"^\s*(?:el)?if\b")
# Arguments that order an atomic rather than say what it adds.
_ORDERING_ARGUMENT = re.compile(r",?\s*(?:memory_order|sem|scope|order)\s*=\s*[^,)]+|"
                                r",?\s*(?:std::)?memory_order\w*|,?\s*memoryOrder\w+|"
                                r",?\s*__ATOMIC_\w+")


def _sixth_round_hits(line: _Line, order: Order, kind: _File,
                      families: Families, hunk: Hunk) -> list[_Hit]:
    """The sixth round's families on one changed line of code (see docs/risk.md): integer
    widths in kernel code, flags and signals in device memory, collectives called by a
    project's name, the dimension an operation works along, a build recipe's conditions."""
    code = line.code
    low = code.lower()
    seen = kind.changed is None or order in kind.changed
    # Substring tests first: most lines hold none of these families' words.
    # In a lock's or a semaphore's own code a width is a ticket's or a counter's: ordering.
    widths = (kind.device or kind.risky) and not kind.primitive and any(
        word in low for word in _WIDTH_WORDS)
    flags = kind.device and kind.collective and ("flag" in low or "sem" in low or "signal" in low
                                                 or "doorbell" in low)
    collective = seen and any(word in low for word in _COLLECTIVE_WORDS)
    layout = kind.python and kind.risky and seen and any(word in low for word in _DIM_WORDS)
    build = kind.build and _BUILD_CONDITION.match(code)
    if not (widths or flags or collective or layout or build) or not code.strip() or (
            _untouched(code, line) or _LOG_OR_RAISE.match(code) or UNRUN_ASSERT.match(code)):
        return []
    hits: list[_Hit] = []
    if widths and _new(_INT_WIDTH, line):
        hits.append((PRECISION, NUMERICS, "changes an integer width or cast in code that runs "
                     "kernels: where an index, offset or counter overflows or wraps"))
    if flags and any(set(_words_of(name)) & _FLAG_WORDS
                     for match in _IN_MEMORY.finditer(code) for name in match.groups() if name):
        families.explained.update(_run_of(hunk, order[1], order[0]))
        hits.append((SYNC, CONCURRENCY, "changes a flag, signal or semaphore in memory that "
                     "threads, blocks or GPUs poll: which of them waits for which"))
    if collective and _new_call(_COLLECTIVE_CALL, line):
        hits.append((SYNC, CONCURRENCY, "changes a collective's call (its buffers or "
                     "arguments): what every rank sends and receives, and where"))
    if layout and ((_DIM_KEYWORD.search(code) and _keywords_differ(line, _DIM_KEYWORD))
                   or _new_call(_LAYOUT_CALL, line)):
        hits.append((PRECISION, NUMERICS, "changes the dimension an operation works along (a "
                     "dim, an axis, a transpose): which elements it moves or combines"))
    if build and _logic_differs(line):
        hits.append((DEPLOY, PRODUCTION, "changes a build recipe's condition: which extensions "
                     "are built, for which platform or toolkit"))
    return hits


_WIDTH_WORDS = ("size_t", "int64", "int32", "int16", "int8", "uint", "(int", "static_cast",
                "long", "index_t", "unsigned", "ptrdiff")
_COLLECTIVE_WORDS = ("gather", "reduce", "broadcast", "scatter", "toall", "to_all", "send",
                     "recv", "multimem")
_DIM_WORDS = ("dim", "axis", "axes", "shift", "transpose", "permute", "move", "swap", "flip",
              "roll", "squeeze", "flatten")


def _keywords_differ(line: _Line, keyword: re.Pattern[str]) -> bool:
    """Whether the line gives a keyword argument of ``keyword`` a value the other side does
    not give it (``dims=3`` -> ``dims=2``); a new keyword counts."""
    here = {m.group(): _value_end_text(line.raw, m.end()) for m in keyword.finditer(line.raw)}
    there = {m.group(): _value_end_text(line.raw_other, m.end())
             for m in keyword.finditer(line.raw_other)}
    return any(there.get(name) != value for name, value in here.items())


def _value_end_text(text: str, start: int) -> str:
    """The value of a keyword argument starting at ``start``, without layout."""
    depth, i = 0, start
    while i < len(text):
        ch = text[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif (ch == "," and depth == 0) or ch == "\n":
            break
        i += 1
    return "".join(text[start:i].split())


def _sixth_round_runs(lines: Sequence[_Line], h: int, hunk: Hunk, kind: _File,
                      families: Families) -> Iterator[tuple[int, _Hit]]:
    """The sixth round's families over a hunk's lines (see docs/risk.md): a float atomic whose
    operands changed, a preprocessor condition judged by the code it selects, a macro's body
    judged by its name, code inside a synchronisation primitive; and what changes nothing of
    the analysers' rules: a dtype test of bookkeeping, a typed constant."""
    text = "\n".join(line.code for line in lines)
    if ("atomic" in text or "index_add" in text or "scatter_add" in text) and (
            _FLOAT_ATOMIC.search(text)):
        for i, line in enumerate(lines):
            if line.kind != CONTEXT and _FLOAT_ATOMIC.search(line.code) and (
                    kind.changed is None or (h, i) in kind.changed) and not _new(
                    _FLOAT_ATOMIC, line) and _operands_changed(lines, i):
                yield i, (PRECISION, NUMERICS, "changes what an atomic accumulation adds, or "
                          "where (its operands): the grouping and order of a float sum")
    if not kind.python and "#" in text:
        yield from _directive_hits(lines, h, families)
    if kind.device and not kind.python and _SYNC_PRIMITIVE_WORDS & set(
            _words_of(_section_name(hunk.section))):
        name = _section_name(hunk.section)
        for i, line in enumerate(lines):
            if line.kind != CONTEXT and line.code.strip() and not _untouched(line.code, line):
                families.explained.add((h, i))
                yield i, (SYNC, CONCURRENCY, f"changes code inside {name}, a synchronisation "
                          "primitive: how threads and blocks wait for each other")
    if kind.python and "dtype" in text:
        for i in _dtype_tests(lines):
            families.give_way([(h, i)], PRECISION, ACCUMULATION)
            families.quiet.add((h, i))
    if kind.python and "(" in text and _TYPED_CONSTANT.search(text):
        for i, line in enumerate(lines):
            if line.kind != CONTEXT and _TYPED_CONSTANT.search(line.code) and not (
                    _DTYPE_NAME.search(_TYPED_CONSTANT.sub("", line.code))):
                families.give_way([(h, i)], PRECISION)
    if kind.options:
        families.quiet.update((h, i) for i in _options_dropped(lines, _mention(kind.options)))


# What names a type once typed constants are set aside: a dtype word, a type's constructor.
_DTYPE_NAME = re.compile(r"(?i)float|int\d|half|bf16|fp\d|f\d\d|double|dtype|\.to\(")


def _operands_changed(lines: Sequence[_Line], i: int) -> bool:
    """Whether the atomic call starting on line ``i`` (with the lines its brackets run over)
    is missing from the other side, its memory-ordering arguments aside: the same atomic now
    adds another operand, at another place, or a tile where it added an element."""
    line = lines[i]
    call = _ORDERING_ARGUMENT.sub("", _squash(_call_of(lines, i)))
    if _INTEGER_INCREMENT.search(call):
        return False  # an integer counter: concurrency only
    other = _ORDERING_ARGUMENT.sub("", line.raw_other)
    return call not in other


def _directive_hits(lines: Sequence[_Line], h: int,
                    families: Families) -> Iterator[tuple[int, _Hit]]:
    """A preprocessor condition changed (``#if defined(__GFX9__)`` -> ``#if IS_CDNA``,
    ``#if __CUDA_ARCH__ >= 700`` added over a release store) is judged by the code it selects,
    up to its ``#endif``: a barrier, an atomic or the warp's width there makes it concurrency,
    a precision or accumulation path numerics. And a macro's body continued on a line of its
    own (``#define ARCH_HAS_STOCHASTIC_ROUNDING \\`` then the architectures) is judged by the
    macro's name, as an assignment is by its target's."""
    for i, line in enumerate(lines):
        if line.kind == CONTEXT or not (line.code.lstrip().startswith("#") or any(
                lines[k].text.rstrip().endswith("\\") for k in (i - 1, i - 2) if k >= 0)) or (
                _untouched(line.code, line)):
            continue
        if _DIRECTIVE_IF.match(line.code):
            block = _selected(lines, i)
            concurrency, numerics = _what_code_is(block)
            if concurrency or numerics:
                families.explained.add((h, i))
            if concurrency:
                yield i, (SYNC, CONCURRENCY, "changes which code a preprocessor condition "
                          "selects, where it holds a barrier, an atomic or the warp's width")
            if numerics:
                yield i, (PRECISION, NUMERICS, "changes which code a preprocessor condition "
                          "selects, where it holds a precision or accumulation path")
            continue
        macro = _continued_macro(lines, i)
        if macro:
            names = set(_words_of(macro))
            if names & (_FORMAT_WORDS | {"precision", "accum", "fp16", "bf16", "fp8", "fp32",
                                         "tf32"}):
                yield i, (PRECISION, NUMERICS, f"changes the body of {macro}, which names a "
                          "number format, rounding or precision path")
            if names & {"warp", "wave", "wavefront", "sync", "barrier", "atomic"}:
                yield i, (SYNC, CONCURRENCY, f"changes the body of {macro}, which names a "
                          "barrier, an atomic or the warp's width")


def _selected(lines: Sequence[_Line], i: int) -> list[str]:
    """The code of the lines a preprocessor condition at ``i`` selects on its side, up to the
    matching ``#endif`` (its ``#else`` branch included: the condition picks between them)."""
    kind = lines[i].kind
    out: list[str] = []
    depth = 0
    for line in lines[i + 1:]:
        if line.kind not in (CONTEXT, kind):
            continue
        if _DIRECTIVE_OPEN.match(line.code):
            depth += 1
        elif _DIRECTIVE_END.match(line.code):
            if depth == 0:
                break
            depth -= 1
        out.append(line.code)
    return out


def _what_code_is(block: Sequence[str]) -> tuple[bool, bool]:
    """(concurrency, numerics): whether the lines hold a barrier, an atomic or the warp's
    width; a precision, a math intrinsic or an accumulation path (names of macros count)."""
    concurrency = numerics = False
    for code in block:
        if not code.strip():
            continue
        if _WARP_WIDTH.search(code):
            concurrency = True
        for signature, *_ in _NATIVE_SET.matches(code):
            if signature.weak:
                continue
            if signature.category == CONCURRENCY:
                concurrency = True
            elif signature.category == NUMERICS and signature.rule != KERNEL:
                numerics = True
        defined = _DEFINED_MACRO.match(code)
        if defined and set(_words_of(defined.group(1))) & {"accum", "dot2", "vdot2", "fma",
                                                           "precision", "rounding"}:
            numerics = True
    return concurrency, numerics


def _continued_macro(lines: Sequence[_Line], i: int) -> str:
    """The name of the ``#define`` whose body line ``i`` continues (the lines of its side
    above it end with ``\\``), or ""."""
    kind = lines[i].kind
    k = i - 1
    while k >= 0:
        if lines[k].kind in (CONTEXT, kind):
            text = lines[k].text.rstrip()
            if not text.endswith("\\"):
                return ""
            defined = _DEFINED_MACRO.match(text)
            if defined:
                return defined.group(1)
        k -= 1
    return ""


def _section_name(section: str) -> str:
    """The struct or class a hunk header names (`struct DeviceSyncer {`); not a function (a
    kernel named `sync_free_reduce` computes)."""
    match = _SECTION_NAME.match(section)
    return match.group(1) if match else ""


def _dtype_tests(lines: Sequence[_Line]) -> list[int]:
    """The lines of a condition that tests a dtype (``dtype in [torch.float8_e4m3fn, ...]``),
    with the lines its brackets run over, whose branch only answers a question (``return 1``,
    ``raise``): bookkeeping of sizes or support, not a conversion."""
    out: list[int] = []
    for i, line in enumerate(lines):
        if line.kind == CONTEXT or not _CONDITION.match(line.code):
            continue
        statement = _bracketed(lines, i)
        if not _DTYPE_TEST.search(" ".join(lines[k].code for k in statement)):
            continue
        indent = len(line.code) - len(line.code.lstrip())
        body = [other.code for other in lines[statement[-1] + 1:]
                if other.kind in (CONTEXT, line.kind) and other.code.strip()]
        branch = []
        for code in body:
            if len(code) - len(code.lstrip()) <= indent:
                break
            branch.append(code)
        if branch and all(_CONSTANT_BODY.match(code) for code in branch):
            out += statement
    return out


def _bracketed(lines: Sequence[_Line], i: int) -> list[int]:
    """Line ``i`` and the lines of its side its open brackets of any kind run over."""
    kind = lines[i].kind
    out, depth = [], 0
    for k in range(i, len(lines)):
        if lines[k].kind not in (kind, CONTEXT):
            continue
        if k > i and depth <= 0:
            break
        out.append(k)
        code = lines[k].code
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
    return out


_OPTION_TEST = re.compile(r"^\s*(?:el)?if\s+(not\s+)?([A-Za-z_]\w*)\s*:\s*$")


def _default_branch(code: str, options: frozenset[str]) -> bool:
    """Whether the condition ``code`` (``if not use_sdpa:``) tests only a removed option and
    its default made it true (``use_sdpa`` is one of ``options``: removed with a false
    default, the only kind kept there)."""
    test = _OPTION_TEST.match(code)
    return test is not None and test.group(2) in options and bool(test.group(1))


def _removed_options(change: FileChange) -> frozenset[str]:
    """Parameters with a false default (False, None) that the file's diff removes and no
    added line names (``use_sdpa=False``): an option dropped. A condition over one is judged
    under its default: callers that never passed it compute as before, callers that did now
    fail."""
    if not any(line.kind == REMOVED and ("False" in line.text or "None" in line.text)
               for hunk in change.hunks for line in hunk.lines):
        return frozenset()
    removed = "\n".join(line.text for hunk in change.hunks for line in hunk.lines
                        if line.kind == REMOVED)
    added = "\n".join(line.text for hunk in change.hunks for line in hunk.lines
                      if line.kind == ADDED)
    names = {m.group(1) for m in _OPTION.finditer(removed)}
    return frozenset(names - set(_NAME.findall(added)))


_OPTION = re.compile(r"([A-Za-z_]\w*)\s*(?::\s*[\w.\[\]]+\s*)?=\s*(?:False|None)\s*(?=[,)]|$)",
                     re.MULTILINE)


@lru_cache(maxsize=64)
def _mention(options: frozenset[str]) -> re.Pattern[str]:
    """A mention of one of ``options``: its parameter with its default, an argument passing it
    on (``use_sdpa=use_sdpa``, ``args.use_sdpa``), and the comma after it."""
    names = "|".join(re.escape(name) for name in sorted(options))
    return re.compile(rf"(?:\bargs\.)?\b(?:{names})\b(?:\s*(?::[^=,()]*)?=\s*[\w.]+)?\s*,?")


def _options_dropped(lines: Sequence[_Line], mention: re.Pattern[str]) -> list[int]:
    """The lines of the runs that only drop an option the diff removes: its parameter
    (``use_sdpa=False,``), the argument that passed it on (``use_sdpa=use_sdpa``,
    ``args.use_sdpa``)."""
    out: list[int] = []
    for run in change_runs(lines):
        sides = {kind: "".join(mention.sub("", lines[k].raw) for k in run
                               if lines[k].kind == kind) for kind in (REMOVED, ADDED)}
        if any(mention.search(lines[k].raw) for k in run if lines[k].kind == REMOVED) and (
                _squash(sides[REMOVED]) == _squash(sides[ADDED])):
            out += list(run)
    return out


def _file_subject(path: str) -> tuple[str, str] | None:
    """(rule, category) a file's name gives its code (``thread_storage_sync.cc``: sync), or
    None: what the fail-closed rule reports instead of unclassified."""
    stem = PurePosixPath(path).stem
    words = set(_words_of(stem))
    if words & _SYNC_FILE_WORDS:
        return SYNC, CONCURRENCY
    if words & _NUMERIC_FILE_WORDS:
        return PRECISION, NUMERICS
    return None


_DEF_LINE = re.compile(r"^(\s*)(?:async\s+)?def\s+([A-Za-z_]\w*)\s*\(([^)]*)\)?")
_RETURN = re.compile(r"^\s*return\s+(.+?)\s*$")
_TEMPORARY = re.compile(r"^\s*([A-Za-z_]\w*)\s*=(?!=)\s*(.+?)\s*$")
_CHECK = re.compile(r"^\s*(?:assert\b|raise\b|(?:[\w.]*\.)?(?:log\w*|logger|logging|warn\w*|"
                    r"print)\s*\()")


@dataclass(frozen=True)
class _Helper:
    """A function the diff adds: its parameters, and the lines of its added body."""

    params: tuple[str, ...]
    block: tuple[Order, ...]  # its def line and the added lines of its body
    pure: bool  # the body only checks (assert, raise, log), names temporaries and returns


def _extractions(change: FileChange, hunks: Sequence[Sequence[_Line]]) -> set[Order]:
    """The lines of a helper extracted from an expression: a call to a function the diff adds
    stands where the expression it returns stood (``{k: torch.cat(v, dim=0) ...}`` ->
    ``{k: cat_and_assert(k, v) ...}`` with ``def cat_and_assert(k, v): x = torch.cat(v,
    dim=0); assert ...; return x``; ``return self.output(self.norm(h)).float()`` ->
    ``return self.output(self.forward_partial(...)).float()`` with ``return self.norm(h)``).
    The call computes what the expression did; the helper's checks stop a run, they change no
    value. Read as text, without layout: the call with the returned expression (its
    temporaries and parameters put back) in its place is the removed statement."""
    helpers: dict[str, _Helper] = {}
    returns: list[tuple[str, list[Order]]] = []
    for h, lines in enumerate(hunks):
        for i, line in enumerate(lines):
            if line.kind != ADDED:
                continue
            defined = _DEF_LINE.match(line.code)
            if defined:
                helpers[defined.group(2)] = _helper_at(lines, h, i, defined)
            returned = _RETURN.match(line.raw)
            if returned:
                expression, used = _squash(returned.group(1)), [(h, i)]
                temporary = _temporary_of(lines, i, expression)
                if temporary is not None:
                    expression, k = temporary
                    used.append((h, k))
                returns.append((expression, used))
    if not helpers or not returns:
        return set()
    out: set[Order] = set()
    for h, lines in enumerate(hunks):
        removed = {_squash(_call_of(lines, k)): k for k, line in enumerate(lines)
                   if line.kind == REMOVED and line.code.strip()}
        for i, line in enumerate(lines):
            if line.kind != ADDED or not removed:
                continue
            for name, helper in helpers.items():
                if f"{name}(" not in line.code or not helper.pure:
                    continue
                statement = _squash(_call_of(lines, i))
                for expression, used in returns:
                    inlined = _inline_call(statement, name, helper.params, expression)
                    if inlined is not None and inlined in removed:
                        out.update((h, k) for k in _statement(lines, i))
                        out.update((h, k) for k in _statement(lines, removed[inlined]))
                        out.update(used)
                        out.update(helper.block)
    return out


def _helper_at(lines: Sequence[_Line], h: int, i: int, defined: re.Match[str]) -> _Helper:
    """The helper whose ``def`` is the added line ``i``: its parameters and body."""
    indent = len(defined.group(1))
    params = tuple(p.split(":")[0].split("=")[0].strip().lstrip("*")
                   for p in defined.group(3).split(",") if p.strip())
    block: list[Order] = [(h, i)]
    pure = True
    depth = 0
    for k in range(i + 1, len(lines)):
        line = lines[k]
        if line.kind != ADDED:
            break
        code = line.code
        if not code.strip():
            block.append((h, k))
            continue
        if depth == 0 and len(code) - len(code.lstrip()) <= indent:
            break
        if depth == 0 and not (_CHECK.match(code) or _RETURN.match(code) or _TEMPORARY.match(
                code)):
            pure = False
        depth = max(0, depth + code.count("(") + code.count("[") + code.count("{")
                    - code.count(")") - code.count("]") - code.count("}"))
        block.append((h, k))
    return _Helper(params, tuple(block), pure)


def _temporary_of(lines: Sequence[_Line], i: int, name: str) -> tuple[str, int] | None:
    """The expression the added lines above ``i`` (in its helper) assign to ``name``, and its
    line, when ``name`` is a plain name."""
    if not name.isidentifier():
        return None
    for k in range(i - 1, -1, -1):
        line = lines[k]
        if line.kind != ADDED or _DEF_LINE.match(line.code):
            return None
        assigned = _TEMPORARY.match(line.raw)
        if assigned and assigned.group(1) == name:
            return _squash(assigned.group(2)), k
    return None


def _inline_call(statement: str, name: str, params: tuple[str, ...],
                 expression: str) -> str | None:
    """``statement`` (without layout) with its call of ``name`` (and the receiver it is called
    on) replaced by ``expression``, the parameters in it replaced by the call's arguments."""
    match = re.search(rf"(?:[\w.]+\.)?\b{re.escape(name)}\(", statement)
    if match is None:
        return None
    depth, end = 0, match.end() - 1
    while end < len(statement):
        depth += {"(": 1, ")": -1}.get(statement[end], 0)
        end += 1
        if depth == 0:
            break
    arguments = [a for a in statement[match.end():end - 1].split(",") if a]
    values = [a for a in arguments if "=" not in a]
    body = expression
    called = [p for p in params if p not in ("self", "cls")]
    if len(values) == len(called):
        for param, value in zip(called, values, strict=True):
            if param != value:
                body = re.sub(rf"(?<![\w.]){re.escape(param)}\b", value.replace("\\", r"\\"),
                              body)
    return statement[:match.start()] + body + statement[end:]


# --- Seventh round (issue 27, the sixth held-out set) ----------------------------------------
# Names of the file or struct that holds a service's configuration and its defaults.
_CONFIGURATION_WORDS = frozenset({"config", "configs", "configuration", "settings", "defaults",
                                  "options"})
# Template arguments of a call or a type (`scan_launch<64, 4, T>(...)`,
# `Traits<kNThreads, kWidth, 64, ...>`): a kernel's compile-time sizes. Not a comparison.
_TEMPLATE_ARGUMENTS = re.compile(r"\b([A-Za-z_][\w:]*)<([^<>;&|=]*)>")
# A template that launches a kernel or describes one (its traits, its policy, its tile).
_LAUNCH_TEMPLATE_WORDS = frozenset({"launch", "launcher", "kernel", "kernels", "traits",
                                    "ktraits", "config", "configs", "policy", "tile", "tiles",
                                    "dispatch"})
# A count of host threads, by its name (`max_threads`, `rpc_thread_num`, `num_io_threads`).
_HOST_THREAD_WORDS = frozenset({"threads", "thread", "nthreads"})
# A subscript that slices (`x[:, -(k - 1):]`, `kv[:, :, :, start:]`).
_SLICE = re.compile(r"\[([^\[\]{}]*:[^\[\]{}]*)\]")
# Creating a file or directory that may exist already, without a check before it: the check
# and the creation raced between processes (`if not exists: makedirs` -> `exist_ok=True`).
_CREATE_RACE = re.compile(r"\bexist_ok\s*=\s*True\b|\bO_EXCL\b|\bFileExistsError\b|"
                          r"\bcreate_directories\s*\(|\bmkdir\s+-p\b")
# A requirement with a version specifier, as a build recipe writes it (install_requires).
_REQUIREMENT = re.compile(r"""["'][A-Za-z0-9][\w.\-\[\],]*\s*(?:===|[<>!~=]=|[<>])\s*"""
                          r"""[\w.*+!]+(?:\s*,\s*(?:===|[<>!~=]=|[<>])\s*[\w.*+!]+)*\s*["']""")
# Names of a memory-ordering mode (PCIe relaxed ordering, a relaxed consistency model).
_ORDERING_WORDS = frozenset({"ordering", "relaxed"})
# A read of a GPU value on the host: the host waits for the stream there.
_HOST_READ = re.compile(r"\.(?:item|tolist)\(\s*\)")
# A residual (skip) connection summed into the hidden state.
_RESIDUAL = re.compile(r"(?i)\w*(?:residual|shortcut)\w*")
# A test of the GPU's compute capability: which generations take a path.
_CAPABILITY = re.compile(r"\b\w*device_capability\w*\b|\bcompute_capability\w*|"
                         r"\b\w*prop\w*(?:\.|->)(?:major|minor)\b|"
                         r"\bcudaDevAttrComputeCapability\w*|\bsm_version\b|\bcc_(?:major|minor)\b|"
                         r"\b(?:is|has)_sm\d+\w*")
_PRECISION_NAME = re.compile(r"(?i)fp8|fp16|bf16|int8|int4|fp4|tf32|float8|half|e4m3|e5m2|"
                             r"quant")
# A kernel's grid or threadgroup, declared by type or named as one.
_GRID_DECL = re.compile(r"\b(?:dim3|MTL::Size|MTLSize|sycl::(?:nd_)?range\s*<\s*\d\s*>)\s+(\w+)")
_GRID_WORDS = frozenset({"grid", "grids", "threadgroup", "threadgroups"})
# Tying a buffer's life to GPU work still queued: it lives until the command buffer or stream
# completes (MLX's add_temporary, PyTorch's record_stream, Metal's completion handlers).
_LIFETIME = re.compile(r"\badd_temporar(?:y|ies)\s*\(|\brecord_stream\s*\(|"
                       r"\baddCompletedHandler\b|\badd_completed_handler\s*\(|\bkeep_alive\w*\s*\(")
_LIFETIME_HINT = re.compile(r"temporar|record_stream|ompleted|keep_alive")
# A rank (not a tensor's `.rank()`): which process of a parallel group runs a line.
_RANK = re.compile(r"(?<![.>])\b(?:\w*_rank|rank_\w*|rank|[a-z]\w*Rank\w*)\b(?!\s*\(\s*\))|"
                   r"\bget_?\w*[Rr]ank\s*\(")
# A lock held for the rest of a C++ scope.
_LOCK_GUARD = re.compile(r"\b(?:std::)?(?:lock_guard|unique_lock|shared_lock|scoped_lock)\b|"
                         r"\b(?:absl::)?(?:Reader|Writer)?MutexLock\b|\b\w*LockGuard\b|"
                         r"\bpthread_(?:mutex|rwlock|spin)_\w*lock\s*\(")
# Placements of a distributed tensor (DTensor, GSPMD): which ranks hold which part, and how
# its gradients are summed.
_PLACEMENT = re.compile(r"\w*(?:placements?|shardings?)\b|\b(?:Replicate|Shard|Partial)\s*\(|"
                        r"\bredistribute\s*\(")
_PLACEMENT_HINT = re.compile(r"lacement|harding|Replicate|Shard|Partial|redistribute")
# A statement that is one call: `torch.use_deterministic_algorithms(True)`.
_CALL_STATEMENT = re.compile(r"^\s*([\w.:>-]+)\s*\((.*)\)\s*;?\s*$")
# Checks in a test: an exact one, and a bound (a difference within a slack).
_BOUND = re.compile(r"\babs\s*\(|\bfabs\w*\s*\(|\b(?:EXPECT|ASSERT)_NEAR\b|\bassertAlmostEqual\b|"
                    r"\bapprox\s*\(|\ballclose\b|\bisclose\b")
_EXACT_CHECK = re.compile(r"==|\bassertEqual\b|\b(?:EXPECT|ASSERT)_(?:EQ|FLOAT_EQ|DOUBLE_EQ)\b|"
                          r"\btorch\.equal\b|\barray_equal\b")
_CHECKS = re.compile(r"\bassert|\b(?:EXPECT|ASSERT|CHECK)_|\bcheck\w*\(")
# A tolerance table: `float grad_thresholds[N] = {`, `TOLS = {`, `tols = dict(`.
_TABLE_START = re.compile(r"\b([A-Za-z_]\w*)\s*(?:\[[^\]=]*\]\s*)*(?::[^=\n]*)?=(?!=)\s*"
                          r"(?:dict\(|[\[({])")
_ALL_RULES = (PRECISION, ACCUMULATION, KERNEL, FAST_MATH, SYNC, THREADS, ATOMICS, LOCKS,
              SERVING, LAUNCH, DEPLOY)


def _seventh_round_hits(line: _Line, order: Order, kind: _File, hunk: Hunk) -> list[_Hit]:
    """The seventh round's families on one changed line of code (see docs/risk.md): a
    buffer's life tied to queued GPU work, a kernel's template sizes, a slice, a
    check-then-create race, a build recipe's pins, a memory-ordering mode, a configuration's
    defaults, a host read of a GPU value, a residual sum, a compute-capability test, a grid."""
    code = line.code
    if not code.strip() or _LOG_OR_RAISE.match(code):
        return []
    hits: list[_Hit] = []
    if _LIFETIME_HINT.search(code) and _LIFETIME.search(code):  # moved counts: its place
        hits.append((SYNC, CONCURRENCY, "changes how long a buffer lives against GPU work still "
                     "queued (kept until the command buffer or stream completes): a buffer "
                     "freed or reused under a running kernel"))
    if _untouched(code, line):
        return hits
    seen = kind.changed is None or order in kind.changed
    renamed = line.kin is not None and not _numbers_differ(line) and not _logic_differs(line)
    name = line.target
    words = set(_words_of(name)) if name else set()
    low = code.lower()
    if not kind.python and (kind.device or kind.risky) and "<" in code and (
            _template_sizes_changed(line)):
        hits.append((PRECISION, NUMERICS, "changes a kernel's compile-time sizes (template "
                     "arguments: threads, items per thread, a chunk): how work is split, and "
                     "so how a reduction is grouped"))
    if kind.python and kind.risky and seen and not renamed and ":" in code and "[" in code and (
            _slices(code) - _slices(line.other)):
        hits.append((PRECISION, NUMERICS, "changes a slice (which dimension, which bound): "
                     "which elements an operation reads or keeps"))
    if not kind.test and ("exist" in code or "EXCL" in code or "create_dir" in code) and _new(
            _CREATE_RACE, line):
        hits.append((THREADS, CONCURRENCY, "changes how a file or directory is created when it "
                     "may exist already: a check and a create that race between processes"))
    if kind.build and any(not _untouched_raw(m.group(), line)
                          for m in _REQUIREMENT.finditer(line.raw)):
        hits.append((DEPLOY, PRODUCTION, "changes a dependency pin of the package "
                     "(install_requires): which versions production installs with it"))
    if words & _ORDERING_WORDS and not renamed and _value_changed(name or "", line):
        hits.append((ATOMICS, CONCURRENCY, f"changes a memory-ordering mode ({name}): what "
                     "other threads, devices or the NIC see of writes, and in which order"))
    if name and not renamed and not kind.python and (
            kind.configuration or "default" in words or set(
                _words_of(_section_name(hunk.section))) & _CONFIGURATION_WORDS) and (
            _assigned_anew(name, line, _LITERAL)):
        hits.append((SERVING, PRODUCTION, f"changes a default of the service's configuration "
                     f"({name}): how production runs when nobody sets it"))
    if kind.python and kind.risky and ("item(" in code or "tolist(" in code) and _new(
            _HOST_READ, line) and _host_reads_rewritten(line):
        hits.append((SYNC, CONCURRENCY, "adds or removes a read of a GPU value on the host "
                     "(.item(), .tolist()): where the host waits for the stream"))
    if (kind.risky or kind.device) and ("residual" in low or "shortcut" in low) and "+" in code \
            and not renamed and _RESIDUAL.search(code):
        hits.append((ACCUMULATION, NUMERICS, "adds or removes a residual sum (a skip connection "
                     "into the hidden state): the values every later layer computes on"))
    if ("capab" in low or "major" in low or "minor" in low or "sm" in low) and not kind.test \
            and not renamed and _CAPABILITY.search(code):
        hits.append((SERVING, PRODUCTION, "changes a compute-capability test: which GPU "
                     "generations production runs which path on"))
        if _PRECISION_NAME.search(name or "") or _PRECISION_NAME.search(
                _enclosing_name(hunk, order[1])):
            hits.append((PRECISION, NUMERICS, "changes which GPUs take a precision path (int8, "
                         "fp8): the precision values are computed in there"))
    if not kind.device and not kind.test and "thread" in low and not renamed and (
            _numbers_differ(line)) and any(set(_words_of(word)) & _HOST_THREAD_WORDS
                                           for word in _NAME.findall(code)):
        hits.append((THREADS, CONCURRENCY, "changes a count of host threads (a flag's default, "
                     "a constant, a condition on it): what runs at once"))
    grid = _GRID_DECL.search(code) if not kind.python else None
    if (grid or words & _GRID_WORDS) and not renamed and not _DEF.match(code) and (
            kind.device or kind.risky or grid) and _changes_a_value(line):
        hits.append((PRECISION, NUMERICS, "changes a kernel's grid or threadgroup size: which "
                     "elements get a thread (a tail left out or covered) and how a split "
                     "reduction is grouped"))
    return hits


def _host_reads_rewritten(line: _Line) -> bool:
    """Whether the other side reads GPU values on the host another way (``.item()`` per
    element -> one ``.tolist()``): the host's waits re-batched, not a read of a CPU value
    added."""
    here = {m.group() for m in _HOST_READ.finditer(line.code)}
    there = {m.group() for m in _HOST_READ.finditer(line.other)}
    return bool(there) and here != there


def _template_sizes_changed(line: _Line) -> bool:
    """Whether a template's arguments (``launch<64, 4, T>``) differ from the same template's
    on the other side, a number among them on either side."""
    for match in _TEMPLATE_ARGUMENTS.finditer(line.code):
        if not set(_words_of(match.group(1).rsplit("::", 1)[-1])) & _LAUNCH_TEMPLATE_WORDS:
            continue
        there = re.search(rf"\b{re.escape(match.group(1))}<([^<>;&|=]*)>", line.other)
        if there is None:
            continue
        here, other = _squash(match.group(2)), _squash(there.group(1))
        if here != other and (_NUMBER.search(here) or _NUMBER.search(other)):
            return True
    return False


def _slices(text: str) -> set[str]:
    """The slices of a line with their names blanked (a rename is no change)."""
    return {_NAME.sub("x", "".join(m.group(1).split())) for m in _SLICE.finditer(text)}


_STATEMENT_WORD = re.compile(r"^\s*(?:return|else|for|while|switch|case|do|throw|new|delete|"
                             r"using|typedef|goto)\b")
_FUNCTION_HEAD = re.compile(r"^\s*(?:async\s+def\s+|def\s+|[\w:<>*&,\s]+?[\s*&])"
                            r"([A-Za-z_]\w*)\s*\([^;]*$")


def _enclosing_name(hunk: Hunk, i: int) -> str:
    """The function a hunk's line ``i`` is in, as far as the hunk shows it (its header or a
    signature above the line); "" if none shows."""
    for k in range(i - 1, -1, -1):
        text = hunk.lines[k].text
        head = _FUNCTION_HEAD.match(text)
        if head and not _CONDITION.match(text) and not _STATEMENT_WORD.match(text):
            return head.group(1)
    head = _FUNCTION_HEAD.match(hunk.section)
    return head.group(1) if head else hunk.section


def _seventh_round_runs(lines: Sequence[_Line], h: int, hunk: Hunk, kind: _File,
                        families: Families) -> Iterator[tuple[int, _Hit]]:
    """The seventh round's families over a hunk's lines (see docs/risk.md): code inside a C++
    lock guard's scope, a distributed tensor's placements, a condition on the rank over a
    value; and what changes nothing: a setter's call dropped where the next statement calls
    it again with the same value."""
    text = "\n".join(line.code for line in lines)
    if not kind.python and ("lock" in text or "Lock" in text) and _LOCK_GUARD.search(text):
        yield from _critical_sections(lines)
    if kind.python and _PLACEMENT_HINT.search(text):
        for i in _placement_runs(lines):
            yield i, (SYNC, CONCURRENCY, "changes how a distributed tensor is placed or its "
                      "gradients reduced (placements: Partial, Replicate, Shard): which ranks "
                      "meet, and what is summed")
            yield i, (ACCUMULATION, NUMERICS, "changes a distributed tensor's placements: "
                      "whether partial values are summed across ranks or one rank's kept")
    if (kind.risky or kind.device) and ("rank" in text or "Rank" in text):
        for i in _rank_conditions(lines):
            yield i, (ACCUMULATION, NUMERICS, "changes which ranks compute or contribute a value "
                      "(a condition on the rank): under tensor or data parallelism a term "
                      "added on every rank, or on none, is summed that many times")
    for i in _repeated_calls(lines):
        families.give_way([(h, i)], *_ALL_RULES)
        families.quiet.add((h, i))


def _critical_sections(lines: Sequence[_Line]) -> Iterator[tuple[int, _Hit]]:
    """The changed lines below a lock guard (``std::shared_lock lock(mtx_);``) and inside its
    scope (up to the brace that closes the block it is declared in)."""
    for side in (ADDED, REMOVED):
        depth: int | None = None
        for i, line in enumerate(lines):
            if line.kind not in (CONTEXT, side):
                continue
            code = line.code
            if depth is not None:
                depth += code.count("{") - code.count("}")
                if depth < 0:
                    depth = None
                    continue
                if line.kind == side and code.strip() and not _untouched(code, line) and not (
                        _LOG_OR_RAISE.match(code) or _NATIVE_LOG.match(code)):
                    yield i, (LOCKS, CONCURRENCY, "changes code inside a critical section (a lock "
                              "guard in scope above it): what it reads and writes other threads "
                              "share, and whether a shared lock covers a write")
            if _LOCK_GUARD.search(code):
                depth = 0


def _placement_runs(lines: Sequence[_Line]) -> list[int]:
    """The changed lines of runs that touch a distributed tensor's placements: the run's
    lines or the statement it sits in (the nearest line above it with less indentation)
    name them."""
    out: list[int] = []
    for run in change_runs(lines):
        changed = [k for k in run if lines[k].code.strip() and not _untouched(lines[k].code,
                                                                               lines[k])]
        if not changed:
            continue
        first = lines[run[0]].code
        indent = len(first) - len(first.lstrip())
        opener = ""
        for k in range(run[0] - 1, -1, -1):
            code = lines[k].code
            if lines[k].kind == CONTEXT and code.strip() and len(code) - len(code.lstrip()) < (
                    indent):
                opener = code
                break
        if _PLACEMENT.search(opener) or any(_PLACEMENT.search(lines[k].code) for k in run):
            out += changed
    return out


def _rank_conditions(lines: Sequence[_Line]) -> list[int]:
    """The changed conditions on a rank (``if (tp && getCurRank() != 0)``) whose body (the
    next lines of its side) assigns a value, not a collective's call or a log line."""
    out: list[int] = []
    for i, line in enumerate(lines):
        if line.kind == CONTEXT or not _CONDITION.match(line.code) or not _RANK.search(
                line.code) or _untouched(line.code, line) or not _logic_differs(line):
            continue
        body = [lines[k].code for k in range(i + 1, min(len(lines), i + 4))
                if lines[k].kind in (CONTEXT, line.kind) and lines[k].code.strip()][:2]
        if any(re.search(r"(?<![=!<>])=(?!=)", code) and not _COLLECTIVE.search(code)
               and not _LOG_OR_RAISE.match(code) and not _NATIVE_LOG.match(code)
               for code in body):
            out.append(i)
    return out


def _repeated_calls(lines: Sequence[_Line]) -> list[int]:
    """Removed calls whose next statement on the old side, kept, calls the same function with
    the same arguments first (``use_deterministic_algorithms(True)`` before
    ``use_deterministic_algorithms(True, warn_only=...)``): the kept call sets it again."""
    out: list[int] = []
    for i, line in enumerate(lines):
        if line.kind != REMOVED:
            continue
        call = _CALL_STATEMENT.match(line.raw)
        if call is None:
            continue
        following = next((k for k in range(i + 1, len(lines))
                          if lines[k].kind != ADDED and lines[k].code.strip()), None)
        if following is None or lines[following].kind != CONTEXT:
            continue
        kept = _call_of(lines, following)
        prefix = _squash(f"{call.group(1)}({call.group(2)}")
        if kept.startswith(prefix) and kept[len(prefix):len(prefix) + 1] in (",", ")"):
            out.append(i)
    return out


def _bounds_exact_check(line: _Line) -> bool:
    """An added check in a test that bounds a difference (``abs(a - b) < 10``, ``EXPECT_NEAR``)
    where the other side checked exactly (``==``, ``EXPECT_EQ``)."""
    code = line.code
    return line.kind == ADDED and bool(_CHECKS.search(code)) and _new(_BOUND, line) and bool(
        _EXACT_CHECK.search(line.other))


def _tolerance_tables(lines: Sequence[_Line]) -> list[int]:
    """The changed lines of a tolerance table (``float grad_thresholds[N] = {...}``, a
    name with a tolerance word) whose numbers, in order, allow more somewhere on the new
    side: a value loosened, or the table reordered so that an entry gets a larger one."""
    text = "\n".join(line.code for line in lines)
    if not _TOLERANCE_WORD.search(text):
        return []
    tables: dict[str, dict[str, tuple[list[float], list[int]]]] = {ADDED: {}, REMOVED: {}}
    for side in (ADDED, REMOVED):
        name, depth = "", 0
        numbers: list[float] = []
        rows: list[int] = []
        for i, line in enumerate(lines):
            if line.kind not in (CONTEXT, side):
                continue
            code = line.code
            if not name:
                start = _TABLE_START.search(code)
                if start is None or not set(_words_of(start.group(1))) & _TOLERANCE_WORDS:
                    continue
                name, depth, numbers, rows = start.group(1), 0, [], []
                code = code[start.end() - 1:]
            depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
            numbers += [_value(m) for m in _NUMBER.findall(code)]
            if line.kind == side:
                rows.append(i)
            if depth <= 0:
                tables[side][name] = (numbers, rows)
                name = ""
    out: list[int] = []
    for name, (new, rows) in tables[ADDED].items():
        if name not in tables[REMOVED]:
            continue
        old, old_rows = tables[REMOVED][name]
        if new != old and (len(new) != len(old) or any(
                a > b for a, b in zip(new, old, strict=False))):
            out += rows + old_rows
    return out
