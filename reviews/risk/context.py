"""The enclosing function, kernel or critical section of each line of a hunk side.

Contract: ``python_contexts(lines, lexed, section)`` and ``c_contexts(lines, lexed, section)``
return one ``Context`` per line. ``section`` is what git printed after the hunk's second
``@@`` (the enclosing function when the function's first line lies above the hunk).

Python: when the side, dedented, parses, ``ast`` gives the functions, their decorators and the
``with`` blocks exactly; most fragments do not parse (a hunk starts and ends anywhere), and
then the indentation of the lexed lines gives the same spans. A function is a kernel when a
decorator says so (``@triton.jit``, ``@triton.autotune``, ``@cuda.jit``...), when its
signature has ``tl.constexpr`` parameters, or when its visible body calls ``tl.*``.

C, C++, CUDA: a function starts at a line in column 0 that opens a parameter list and ends
at a ``}`` in column 0 (the layout clang-format and every project we read use). It is device
code when its signature says ``__global__`` or ``__device__`` (Metal ``kernel``, OpenCL
``__kernel``, a project's ``*_DEVICE`` macro), or its visible body uses device-only names; a
hunk header showing a kernel's qualifiers opens one, and lines outside any visible function
are device code when their side uses device-only names. A host function computing with SIMD
intrinsics is a CPU kernel (``Context.simd``).
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from reviews.risk.lexers import Lexed
from reviews.risk.signatures import words

_KERNEL_DECORATOR = re.compile(
    r"(?:^|[^\w])(?:triton\.(?:jit|autotune|heuristics)|tl\.\w+|jit|njit|cuda\.jit|numba\.\w*jit"
    r"|tilelang\.jit|T\.prim_func|helion\.kernel|cute\.(?:kernel|jit)|gluon\.jit|libentry"
    r"|triton_heuristics\.\w+)\b")
# Kernel-language calls: Triton's tl.*, TileLang's T.Kernel / T.alloc_* / T.gemm ...
_TRITON_USE = re.compile(r"\b(?:tl\.\w+|T\.(?:Kernel|alloc_\w+|copy|gemm|Parallel|Pipelined|"
                         r"serial|fill|clear|reduce_\w+)\b)")
_REDUCTION_NAME = re.compile(
    words("softmax", "logsumexp", "lse", "reduce", "reduction", "norm", "rmsnorm", "layernorm",
          "l2norm", "groupnorm", "normalize", "normalise", "cumsum", "cumprod", "accumulate",
          "variance", "quant", "quantize", "quantise", "quantized", "dequant", "dequantize",
          "fp8", "int8", "int4", "fp4", "nvfp4", "mxfp4", "awq", "gptq", "marlin",
          # an autograd backward: gradient arithmetic
          "backward"))
# In a file that uses Triton, a function named as a kernel is one, its decorator unseen.
_KERNEL_NAME = re.compile(words("kernel", "kernels"))
_NOT_NUMERIC_NAME = re.compile(words("path", "paths", "url", "name", "names", "text", "str",
                                     "key", "keys", "header", "headers", "config", "args"))
_PY_DEF = re.compile(r"^(\s*)(?:async\s+)?def\s+(\w+)")
_PY_CLASS = re.compile(r"^(\s*)class\s+(\w+)")
_PY_WITH = re.compile(r"^(\s*)(?:async\s+)?with\s+(.+?):\s*$")
_LOCKISH = re.compile(words("lock", "locks", "rlock", "mutex", "semaphore", "condition",
                            "cond", "guard") + r"|\bnogil\b|\bacquire\(")
_C_SIGNATURE = re.compile(r"^(?:template\s*<.*>\s*)?(?:[\w:<>,*&\[\]()]+[\s*&]+)*?"
                          r"([A-Za-z_~][\w:~]*)\s*\(")
# Host code in a CUDA file: launches, streams, asserts of the host side, the C++ library.
_C_HOST_USE = re.compile(r"\b(?:\w*HOST_ASSERT|cudaStream_t|LAUNCH_KERNEL|SETUP_LAUNCH_CONFIG|"
                         r"cudaLaunch\w*|cudaMalloc\w*|cudaMemcpy\w*|std|at|torch|py)::|<<<|"
                         r"\bprintf\b")
_C_CONTROL = re.compile(r"^(?:if|for|while|switch|return|else|do|case|typedef|using|namespace"
                        r"|struct|class|enum|union|extern|#)\b")
_C_DEVICE_USE = re.compile(r"\b(?:threadIdx|blockIdx|blockDim|gridDim|warpSize|__syncthreads|"
                           r"__syncwarp|__shfl\w*|__shared__|__ldg|__activemask|__ballot_sync|"
                           r"lane_id|warp_id|get_lane_id|tid\.x)\b")
# CPU kernels: SIMD vector types and intrinsics (x86 AVX/AVX-512/AMX, Arm NEON).
_C_SIMD_USE = re.compile(r"\b(?:__m(?:128|256|512)\w*|_mm(?:256|512)?_\w+|_tile_\w+|"
                         r"(?:float|int|uint)(?:8|16|32|64)x\d+_t|v\w+q_[fsu]\d+)\b")
_C_DEVICE = re.compile(r"__global__|__device__|\bkernel\s+void\b|__kernel\b|\[\[kernel\]\]|"
                       r"__aicore__|__launch_bounds__|\bKERNEL\b|\bDEVICE\b|"
                       r"\b[A-Z][A-Z0-9]+_DEVICE(?:_INLINE|_FUNC|_FORCEINLINE)?\b")


@dataclass(frozen=True)
class Context:
    function: str = ""  # the enclosing function (or kernel), "" at module level
    kernel: bool = False  # inside device code: a Triton, CUDA or shader kernel
    reduction: bool = False  # inside a function named as a reduction, norm, softmax or quant
    lock: str = ""  # the `with` header of the critical section the line is in
    header: bool = False  # part of a function's signature, not of its body
    # A CPU kernel (``kernel`` is set too): a host function computing with SIMD intrinsics
    # (AVX-512, AMX, NEON). Its threads are host threads, not GPU lanes.
    simd: bool = False


@dataclass
class _Span:
    kind: str  # "def" | "class" | "lock"
    name: str
    first: int  # first line (a decorator's for a function)
    header: int  # the def / with line
    last: int
    evidence: bool = False  # a kernel decorator or tl.constexpr parameters
    body: int = -1  # the first line of the body (-1: the line after the header)


def python_contexts(lines: Sequence[str], lexed: Sequence[Lexed], section: str,
                    *, triton_file: bool = False) -> list[Context]:
    """The context of each line of one side of a Python hunk (see the module docstring).
    ``triton_file``: the diff shows the file uses Triton, so that a function named
    ``*_kernel`` is taken for a kernel even where its decorator lies outside the hunk."""
    spans = _ast_spans(lines)
    if spans is None:
        spans = _indent_spans(lines, lexed)
    n = len(lines)
    uses_triton = [bool(_TRITON_USE.search(line.code)) for line in lexed]
    functions: list[_Span | None] = [None] * n
    classes: list[_Span | None] = [None] * n
    locks: list[_Span | None] = [None] * n
    # Outer spans start first; an inner span, assigned later, overwrites its lines.
    for span in sorted(spans, key=lambda s: (s.first, -s.last)):
        if span.kind == "def":
            span.evidence = span.evidence or any(uses_triton[span.header:span.last + 1])
            functions[span.first:span.last + 1] = [span] * (span.last + 1 - span.first)
        elif span.kind == "class":
            classes[span.first:span.last + 1] = [span] * (span.last + 1 - span.first)
        elif span.kind == "lock":
            locks[span.header + 1:span.last + 1] = [span] * max(0, span.last - span.header)
    header = _python_section(section)
    section_end = _section_end(spans, lines, lexed) if header else 0
    section_kernel = header is not None and (header[1] or any(uses_triton[:section_end]) or (
        triton_file and bool(_KERNEL_NAME.search(header[0]))))
    # A method of `class RMSNorm` computes a norm whatever the method is called.
    section_class = header is None and _is_reduction_name(_python_class(section))
    out: list[Context] = []
    for i in range(n):
        function, lock, klass = functions[i], locks[i], classes[i]
        in_header = False
        if function is not None:
            name, kernel = function.name, function.evidence or (
                triton_file and bool(_KERNEL_NAME.search(function.name)))
            body = function.body if function.body >= 0 else (
                function.last + 1 if function.body == -2 else function.header + 1)
            in_header = function.header <= i < body
        elif header is not None and i < section_end:
            name, kernel = header[0], section_kernel
        else:
            name, kernel = "", False
        reduction = _is_reduction_name(name) or section_class or (
            klass is not None and _is_reduction_name(klass.name))
        out.append(Context(name, kernel, reduction, lock.name if lock else "", in_header))
    return out


def _python_class(section: str) -> str:
    match = _PY_CLASS.match(section)
    return match.group(2) if match else ""


def c_contexts(lines: Sequence[str], lexed: Sequence[Lexed], section: str,
               *, device_file: bool = False, cuda_file: bool = False) -> list[Context]:
    """The context of each line of one side of a C/C++/CUDA hunk; ``device_file`` (a shader
    language) makes every line device code. A function is device code when its visible body
    uses threadIdx, __shared__, warp shuffles and the like; in a CUDA file (``cuda_file``), a
    function whose qualifiers are out of sight (the hunk header shows `combine(`: DeepEP
    writes `__global__ void` on the line above the name) is device code unless its visible
    body is plainly host code (launches, streams, host asserts)."""
    current = _c_function(section, "")
    if current is None and _C_DEVICE.search(section) and not _C_CONTROL.match(section.strip()):
        # The header shows a kernel's qualifiers, its name on the next line out of sight:
        # `void __global__ __launch_bounds__(WARPS * WARP_SIZE)`.
        current = ("", True)
    above = ""  # template<...>, qualifier and return-type lines just above a signature
    owner: list[int] = []  # per line: the index of its function in `functions`, or -1
    functions: list[_CFunction] = []
    if current is not None:
        unseen = bool(re.match(r"[A-Za-z_~][\w:~]*\s*\(", section.strip()))
        functions.append(_CFunction(current[0], current[1], unseen=unseen))
    headers: set[int] = set()
    for i in range(len(lines)):
        code = lexed[i].code
        if code.startswith("}"):
            owner.append(len(functions) - 1 if current is not None else -1)
            current, above = None, ""
            continue
        stripped = code.strip()
        if code[:1].isalpha() or code[:1] == "_":
            found = _c_function(code, above) if not stripped.endswith(";") else None
            if found is not None:
                current = found
                functions.append(_CFunction(*found))
                headers.add(i)
                above = ""
            else:
                above = "" if stripped.endswith((";", "{", "}")) else f"{above} {code}"
        index = len(functions) - 1 if current is not None else -1
        owner.append(index)
        if index >= 0:
            functions[index].device_use |= bool(_C_DEVICE_USE.search(code))
            functions[index].host_use |= bool(_C_HOST_USE.search(code))
            functions[index].simd_use |= ("_m" in code or "x4_t" in code or "x8_t" in code
                                          or "q_" in code or "_tile" in code) and (
                bool(_C_SIMD_USE.search(code)))
    # Lines outside any function the hunk shows: device code when the side's visible lines use
    # what only device code uses (threadIdx, __shared__, __syncthreads), a hunk of a kernel
    # whose signature and hunk header are both out of sight (git shows `namespace aiter`).
    loose = device_file or (-1 in owner and bool(_C_DEVICE_USE.search("\n".join(
        lexed[i].code for i in range(len(lines)) if owner[i] < 0))))
    out: list[Context] = []
    for i, index in enumerate(owner):
        if index < 0:
            out.append(Context("", loose, False, ""))
            continue
        function = functions[index]
        # In CUDA or HIP source a function named as a kernel is one, its __global__ on the
        # line above out of sight (seventh round: `void conv1d_fwd_kernel(Params p) {`).
        kernel = function.declared_device or function.device_use or device_file or (
            cuda_file and (function.unseen or _is_kernel_name(function.name))
            and not function.host_use)
        simd = not kernel and function.simd_use
        out.append(Context(function.name, kernel or simd, _is_reduction_name(function.name), "",
                           i in headers, simd))
    return out


@dataclass
class _CFunction:
    name: str
    declared_device: bool
    device_use: bool = False  # its visible body uses threadIdx, __shared__, shuffles
    host_use: bool = False  # its visible body launches kernels, uses streams, host asserts
    unseen: bool = False  # its qualifiers are out of sight: the hunk header is `name(`
    simd_use: bool = False  # its visible body or signature computes with SIMD intrinsics


# Attributes written like calls before a function's name: part of its qualifiers.
_C_ATTRIBUTES = frozenset({"__launch_bounds__", "__attribute__", "alignas", "__declspec",
                           "__align__", "__maxnreg__", "__cluster_dims__"})


def _c_function(signature: str, above: str) -> tuple[str, bool] | None:
    """(name, declared as device code) of a function whose signature starts on this line."""
    match = _C_SIGNATURE.match(signature.strip())
    if match is None or _C_CONTROL.match(signature.strip()) or match.group(1) in _C_ATTRIBUTES:
        return None
    return match.group(1), bool(_C_DEVICE.search(above + " " + signature))


@lru_cache(maxsize=4096)
def _is_kernel_name(name: str) -> bool:
    return bool(name) and bool(_KERNEL_NAME.search(name.rsplit("::", 1)[-1]))


@lru_cache(maxsize=4096)
def _is_reduction_name(name: str) -> bool:
    return bool(name) and bool(_REDUCTION_NAME.search(name)) and not (
        _NOT_NUMERIC_NAME.search(name))


def _python_section(section: str) -> tuple[str, bool] | None:
    """(function name, kernel evidence) of the hunk header's function, if it names one."""
    match = _PY_DEF.match(section)
    if match:
        return match.group(2), "constexpr" in section
    if section.startswith("@"):
        return "", bool(_KERNEL_DECORATOR.search(section))
    return None


def _section_end(spans: Sequence[_Span], lines: Sequence[str], lexed: Sequence[Lexed]) -> int:
    """Where the hunk header's function ends: at a statement in column 0 (not a bracket that
    closes its parameter list: a hunk may start inside the signature), or where a function or
    class of the hunk itself starts."""
    starts = {span.first for span in spans if span.kind in ("def", "class")}
    for i, line in enumerate(lines):
        if i in starts or (lexed[i].has_code and lexed[i].depth == 0 and (
                not lexed[i].starts_in_string) and not line[:1].isspace() and (
                line[:1] not in ")]}")):
            return i
    return len(lines)


# Parsing a longer side costs more than the rest of its analysis (measured: 60 ms for
# 10,000 lines); such a side is almost always a whole new file, which indentation reads well.
_AST_MAX_LINES = 2000


def _ast_spans(lines: Sequence[str]) -> list[_Span] | None:
    if len(lines) > _AST_MAX_LINES or not _may_parse(lines):
        return None
    try:
        tree = ast.parse(textwrap.dedent("\n".join(lines)))
    except (SyntaxError, ValueError):
        return None
    spans: list[_Span] = []
    for node in _statements(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            decorators = [ast.unparse(d) for d in node.decorator_list]
            annotations = [ast.unparse(a.annotation) for a in
                           (*node.args.args, *node.args.kwonlyargs) if a.annotation]
            first = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            evidence = any(_KERNEL_DECORATOR.search(d) for d in decorators) or any(
                "constexpr" in a for a in annotations)
            spans.append(_Span("def", node.name, first, node.lineno - 1,
                               (node.end_lineno or node.lineno) - 1, evidence,
                               node.body[0].lineno - 1 if node.body else -1))
        elif isinstance(node, ast.ClassDef):
            spans.append(_Span("class", node.name, node.lineno - 1, node.lineno - 1,
                               (node.end_lineno or node.lineno) - 1))
        elif isinstance(node, ast.With | ast.AsyncWith):
            header = ", ".join(ast.unparse(item.context_expr) for item in node.items)
            if _LOCKISH.search(header):
                spans.append(_Span("lock", header, node.lineno - 1, node.lineno - 1,
                                   (node.end_lineno or node.lineno) - 1))
    return spans


def _may_parse(lines: Sequence[str]) -> bool:
    """False for a fragment that cannot parse, known without parsing it (most hunks): its
    first line is indented deeper than a later one, or continues a bracket or a statement."""
    code = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not code:
        return False
    first = len(code[0]) - len(code[0].lstrip())
    if any(len(line) - len(line.lstrip()) < first for line in code):
        return False
    return not code[0].lstrip().startswith((")", "]", "}", ",", ".", "else", "elif", "except",
                                            "finally", "and ", "or ", "+", "-", "*", "/", "|"))


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, nested ones included (not expressions: they cannot hold a def, a
    class or a with, and walking them costs most of ast.walk's time)."""
    for node in body:
        yield node
        for name in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(node, name, None) or [])
        for handler in getattr(node, "handlers", None) or []:
            yield from _statements(handler.body)
        for case in getattr(node, "cases", None) or []:
            yield from _statements(case.body)


def _indent_spans(lines: Sequence[str], lexed: Sequence[Lexed]) -> list[_Span]:
    spans: list[_Span] = []
    stack: list[tuple[int, _Span]] = []
    decorators: list[int] = []
    last_code = -1
    for i, line in enumerate(lines):
        lex = lexed[i]
        if not lex.has_code or lex.depth > 0 or lex.starts_in_string:
            if lex.depth > 0 and stack and stack[-1][1].kind == "def" and (
                    stack[-1][1].body < 0):
                if "constexpr" in lex.code:
                    stack[-1][1].evidence = True  # a parameter of the signature above
                stack[-1][1].body = -2  # still in the signature
            if lex.has_code:
                last_code = i
            continue
        text = line.expandtabs(8)
        indent = len(text) - len(text.lstrip())
        for _, open_span in stack:
            if open_span.kind == "def" and open_span.body < 0:
                open_span.body = i  # the first statement after the signature
        while stack and stack[-1][0] >= indent:
            stack.pop()[1].last = last_code
        stripped = text.strip()
        match = _PY_DEF.match(text) or _PY_CLASS.match(text)
        with_match = _PY_WITH.match(lex.code.expandtabs(8))
        if stripped.startswith("@"):
            decorators.append(i)
        elif match:
            kind = "def" if _PY_DEF.match(text) else "class"
            first = decorators[0] if decorators else i
            evidence = any(_KERNEL_DECORATOR.search(lines[d]) for d in decorators) or (
                "constexpr" in lex.code)
            span = _Span(kind, match.group(2), first, i, len(lines) - 1, evidence)
            spans.append(span)
            stack.append((indent, span))
            decorators = []
        else:
            decorators = []
            if with_match and _LOCKISH.search(with_match.group(2)):
                span = _Span("lock", with_match.group(2).strip(), i, i, len(lines) - 1)
                spans.append(span)
                stack.append((indent, span))
        last_code = i
    for _indent, span in stack:
        span.last = len(lines) - 1
    return spans
