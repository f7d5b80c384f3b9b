"""The signatures of risky code, per language: what a changed token must be part of.

A ``Signature`` is a regular expression tried on the code of a changed line (comments blanked,
string contents masked: see ``lexers``); it fires only where its match overlaps a token the
change touched, so a line that merely contains ``torch.float16`` next to the edit does not.
Names are matched as identifier *words*: ``words("lock")`` finds ``self._lock``, ``RLock``
and ``LOCK_TIMEOUT`` but not ``block`` or ``KVBlock``; ``atomicAdd`` has the word ``atomic``.

Within one rule, the first match on a line that overlaps the change gives the reason; the
others are not searched for. A rule is searched only on lines that contain one of its
required literals (``required_literals``), which most lines do not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from re import _parser as _sre  # type: ignore[attr-defined]  # the parser re.compile uses
from typing import Any

NUMERICS = "numerics"
CONCURRENCY = "concurrency"
PRODUCTION = "production"
UNCLASSIFIED = "unclassified"

# Rule names: stable identifiers shown on the change page and stored with each finding.
PRECISION = "precision"
ACCUMULATION = "accumulation"
KERNEL = "kernel"
FAST_MATH = "fast-math"
LOCKS = "locks"
THREADS = "threads"
SYNC = "sync"
ATOMICS = "atomics"
DEPLOY = "deploy"
LAUNCH = "launch"
SERVING = "serving"
UNREADABLE = "unreadable"
UNSURE = "unsure"

RULE_CATEGORY = {
    PRECISION: NUMERICS, ACCUMULATION: NUMERICS, KERNEL: NUMERICS, FAST_MATH: NUMERICS,
    LOCKS: CONCURRENCY, THREADS: CONCURRENCY, SYNC: CONCURRENCY, ATOMICS: CONCURRENCY,
    DEPLOY: PRODUCTION, LAUNCH: PRODUCTION, SERVING: PRODUCTION, UNREADABLE: UNCLASSIFIED,
    UNSURE: UNCLASSIFIED,
}

_START = r"(?:(?<![A-Za-z0-9])|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z]))"


def words(*names: str) -> str:
    """A regex for identifier words: each name (lower case, digits allowed) as a whole
    snake_case or camelCase segment, written lower, Capitalised or UPPER."""
    variants = []
    for name in sorted(names, key=len, reverse=True):
        for variant, end in ((name, "(?![a-z0-9])"), (name[:1].upper() + name[1:], "(?![a-z0-9])"),
                             (name.upper(), "(?![a-z0-9])(?![A-Z](?![a-z]))")):
            literal = re.escape(variant)
            # The literal first and the word boundary checked behind it: a pattern that
            # starts with a literal is scanned for fast; one that starts with a lookbehind
            # is tried at every position (30 times slower, measured).
            variants.append(f"{literal}(?<={_START}{literal}){end}")
    return "|".join(dict.fromkeys(variants))


def ci_word(name: str) -> str:
    """``name`` in any letter case, as a word that no letter or digit precedes."""
    literal = "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in name)
    return f"{literal}(?<![A-Za-z0-9]{literal})"


@dataclass(frozen=True)
class Signature:
    rule: str
    pattern: str
    reason: str  # a sentence for the reviewer; {m} is replaced by the matched text
    # A weak signature (an accumulator's name, a small constant) is dropped from a line that
    # another class already explains: `atomicAdd(&sum, x)` is an atomic, `sleep(1e-3)` a wait.
    weak: bool = False
    # Searched in the line with its strings (flags are written in strings: setup.py's
    # extra_compile_args) rather than in the code with strings masked.
    raw: bool = False
    # Whether a name's value or arguments count as part of the match (see analysers'
    # _extend); False: only the matched tokens themselves (torch.empty -> torch.zeros).
    extend: bool = True

    @property
    def category(self) -> str:
        return RULE_CATEGORY[self.rule]


@dataclass(frozen=True)
class _Index:
    rules: list[tuple[str, bool, re.Pattern[str]]]  # (rule, searched in the raw line, regex)
    owners: dict[str, frozenset[int]]
    hints: re.Pattern[str] | None
    always: frozenset[int]
    always_order: list[int]


# A log statement: a C or C++ log macro, printf or stream, or a Python print or logger call.
# A switch's name inside its message is text, not the switch (raw signatures see strings).
_LOG_LINE = re.compile(r"^\s*(?:[\w:]*LOG\w*|[\w:]*Log\w*|f?printf|std::(?:cerr|cout|clog)"
                       r"|spdlog::\w+|print|(?:[\w.]*\.)?(?:logger|logging|log)\.\w+)\b\s*(?:\(|<<)")


def is_log_line(code: str) -> bool:
    """Whether the line (comments blanked, strings masked) is a log statement."""
    return _LOG_LINE.match(code) is not None


class SignatureSet:
    """Signatures compiled into one alternation per rule, so that a line costs one search per
    rule however many signatures there are; a rule is searched only on lines that contain
    one of the literals every match of one of its signatures contains (``required_literals``):
    most lines contain none, and a substring test is a hundred times cheaper than a search."""

    def __init__(self, signatures: Iterable[Signature], flags: int = 0) -> None:
        self.signatures = tuple(signatures)
        self._flags = flags

    @cached_property
    def _index(self) -> _Index:
        """The compiled rules, made at the first search rather than at import: compiling every
        set took 0.3 s of each web and worker process's start, most of which never classify a
        diff (measured with python -X importtime)."""
        flags = self._flags
        # A rule's signatures without required literals (a number, an operator) form a group
        # of their own, so that they do not make the rest of the rule run on every line.
        groups: dict[tuple[str, bool, bool], list[tuple[int, Signature]]] = {}
        literals: dict[int, set[str] | None] = {}
        for index, signature in enumerate(self.signatures):
            literals[index] = required_literals(signature.pattern)
            key = (signature.rule, literals[index] is None, signature.raw)
            groups.setdefault(key, []).append((index, signature))
        # (rule, searched in the raw line, regex)
        rules: list[tuple[str, bool, re.Pattern[str]]] = []
        owners: dict[str, set[int]] = {}
        always: set[int] = set()
        for number, ((rule, unhinted, raw), group) in enumerate(groups.items()):
            regex = re.compile("|".join(f"(?P<s{i}>{s.pattern})" for i, s in group), flags)
            rules.append((rule, raw, regex))
            if unhinted:
                always.add(number)
            for hint in set().union(*(literals[i] or set() for i, _ in group)):
                owners.setdefault(hint, set()).add(number)
        # One search finds, at every position, the longest literal starting there: the
        # literals as a trie, in a lookahead (7 us a line; a regex per group cost 50, measured).
        # A literal found also stands for the shorter literals it starts with.
        return _Index(
            rules=rules,
            owners={hint: frozenset().union(*(owners[other] for other in owners
                                              if hint.startswith(other)))
                    for hint in owners},
            hints=re.compile(f"(?=({_trie(owners)}))") if owners else None,
            always=frozenset(always), always_order=sorted(always))

    @property
    def rules(self) -> list[tuple[str, bool, re.Pattern[str]]]:
        return self._index.rules

    @property
    def _owners(self) -> dict[str, frozenset[int]]:
        return self._index.owners

    @property
    def _hints(self) -> re.Pattern[str] | None:
        return self._index.hints

    @property
    def _always(self) -> frozenset[int]:
        return self._index.always

    @property
    def _always_order(self) -> list[int]:
        return self._index.always_order

    def _groups(self, text: str) -> set[int]:
        if self._hints is None:
            return set()
        found: set[int] = set()
        for match in self._hints.finditer(text.lower()):
            found |= self._owners[match.group(1)]
        return found

    def matches(self, code: str, raw: str | None = None,
                ) -> Iterable[tuple[Signature, int, int, str]]:
        """(signature, start, end, matched text) for every match, rule by rule: in ``code``,
        and in ``raw`` (the same line with its strings; default: ``code``) for the raw
        signatures. Literals are looked for in ``raw``, which holds all that ``code`` does."""
        raw = code if raw is None else raw
        for number in sorted(self._groups(raw).union(self._always)):
            _rule, in_raw, regex = self.rules[number]
            for match in regex.finditer(raw if in_raw else code):
                if match.lastgroup is None or match.end() == match.start():
                    continue
                signature = self.signatures[int(match.lastgroup[1:])]
                yield signature, match.start(), match.end(), match.group()

    def first_matches(self, lines: Sequence[tuple[str, str, Sequence[tuple[int, int]]]],
                      extend: Callable[[str, int, int], tuple[int, int]],
                      ) -> list[dict[str, tuple[Signature, str]]]:
        """For each (code, raw, changed spans) line: rule -> (the first signature of the rule
        whose match, widened by ``extend(code, start, end)``, overlaps a changed span; the
        widened match's text in ``raw``). The literals of all lines are looked for in one
        search (a search per line cost as much as all the rest, measured)."""
        found: list[set[int]] = [set() for _ in lines]
        if self._hints is not None and lines:
            starts: list[int] = []
            position = 0
            for _, raw, _ in lines:
                starts.append(position)
                position += len(raw) + 1
            text = "\n".join(raw for _, raw, _ in lines).lower()
            line = 0
            for match in self._hints.finditer(text):
                at = match.start()
                while line + 1 < len(starts) and starts[line + 1] <= at:
                    line += 1
                found[line] |= self._owners[match.group(1)]
        out: list[dict[str, tuple[Signature, str]]] = []
        for (code, raw, spans), groups in zip(lines, found, strict=True):
            hits: dict[str, tuple[Signature, str]] = {}
            for number in sorted(groups.union(self._always)) if groups else self._always_order:
                rule, in_raw, regex = self.rules[number]
                if rule in hits:
                    continue
                text = raw if in_raw else code
                for match in regex.finditer(text):
                    start, end = match.span()
                    if start == end or match.lastgroup is None:
                        continue
                    signature = self.signatures[int(match.lastgroup[1:])]
                    if not in_raw and signature.extend:
                        start, end = extend(code, start, end)
                    elif in_raw and code[start:end] != raw[start:end] and is_log_line(code):
                        continue  # a log message naming a switch (printf("AMX_BF16_MOE"))
                    if any(a < end and start < b for a, b in spans):
                        hits[rule] = (signature, raw[start:end])
                        break
            out.append(hits)
        return out


def _trie(words: Iterable[str]) -> str:
    """A regex matching the longest of ``words`` at a position, written as a trie."""
    root: dict[str, dict] = {}  # type: ignore[type-arg]
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str:  # type: ignore[type-arg]
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
        if "" in node:
            body = f"(?:{body})?" if len(branches) == 1 else f"{body}?"
        return body

    return emit(root)


def required_literals(pattern: str) -> set[str] | None:
    """Lower-case strings of which every match of ``pattern`` contains at least one; None
    when the pattern has no such set (a match may be all digits or punctuation).

    Read from the parsed pattern (``re._parser``, the parser ``re.compile`` itself uses); if
    a Python release changes it, every rule is searched on every line: slower, not wrong.
    """
    try:
        parsed = _sre.parse(pattern)
    except Exception:  # the private parser moved or changed: search every line
        return None
    try:
        return _required(list(parsed))
    except Exception:
        return None


def _required(items: list[tuple[Any, Any]]) -> set[str] | None:
    """Literals one of which every match of the sequence ``items`` contains (see above)."""
    best: set[str] | None = None
    run: list[str] = []

    def offer(candidate: set[str] | None) -> None:
        nonlocal best
        if candidate and (best is None or min(map(len, candidate)) > min(map(len, best))):
            best = candidate

    def flush() -> None:
        if len(run) >= 2:
            offer({"".join(run).lower()})
        run.clear()

    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            run.append(chr(av))
            continue
        if name == "IN" and _one_letter(av) is not None:
            run.append(_one_letter(av) or "")
            continue
        if name in ("ASSERT", "ASSERT_NOT", "AT"):
            continue  # zero width: the literal run goes on across it
        flush()
        if name == "SUBPATTERN":
            offer(_required(list(av[-1])))
        elif name == "BRANCH":
            branches = [_required(list(branch)) for branch in av[1]]
            if all(branches):
                offer(set().union(*[b for b in branches if b]))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") and av[0] >= 1:
            offer(_required(list(av[2])))
    flush()
    return best


def _one_letter(av: Any) -> str | None:
    """The letter a character class like [aA] stands for, case aside; None otherwise."""
    letters = {chr(v).lower() for op, v in av if str(op) == "LITERAL"}
    if len(letters) == 1 and all(str(op) == "LITERAL" for op, _ in av):
        return letters.pop()
    return None


def _kw(*names: str) -> str:
    """A keyword argument or assignment with its value: ``name=value`` up to , ) or the end."""
    return rf"\b(?:{'|'.join(names)})\b(?=\s*(?::[^=\n]*)?=(?!=))"


# --- Numerics ------------------------------------------------------------------------------

_DTYPE_WORDS = words(
    "float16", "bfloat16", "fp16", "bf16", "f16", "half2", "float8", "fp8", "f8", "e4m3",
    "e4m3fn", "e4m3fnuz", "e5m2", "e5m2fnuz", "e8m0", "e8m0fnu", "fp4", "nvfp4", "mxfp4",
    "mxfp8", "float4", "int4", "uint4", "int8", "uint8", "qint8", "quint8", "float32", "fp32",
    "f32", "float64", "fp64", "tf32", "tf32x3", "complex64", "complex32",
)
_QUANT_WORDS = words(
    "quant", "quants", "quantize", "quantized", "quantise", "quantised", "quantization",
    "quantisation", "quantizer", "dequant", "dequantize", "dequantise", "qweight", "qzeros",
    "awq", "gptq", "marlin", "smoothquant", "w8a8", "w4a16", "w4a8", "w8a16", "nf4",
    "bitsandbytes", "bnb", "squeezellm", "hqq", "gguf",
)
_TOLERANCE_WORDS = words("atol", "rtol", "eps", "epsilon", "tol", "tolerance", "finfo",
                         "iinfo", "ulp")
_PRECISION_WORDS = words("precision", "autocast", "amp", "mixed_precision", "grad_scaler",
                         "scaler", "fp32_precision", "rounding", "rounding_mode", "stochastic")
_ACC_WORDS = words("acc", "accs", "accum", "accumulator", "accumulators", "accumulate",
                   "accumulated", "accumulation", "softmax", "logsumexp", "lse", "log_softmax",
                   "rmsnorm", "layernorm", "l2norm", "rms_norm", "layer_norm")
_REDUCE_WORD = (f"(?:{words('reduce', 'reduction')})"
                r"(?<!all_reduce)(?<!allreduce)(?<!AllReduce)(?<!all_Reduce)(?!_scatter|Scatter)")

PYTHON_SIGNATURES: tuple[Signature, ...] = (
    # precision modes and types
    Signature(PRECISION, r"input_precision",
              "sets the input precision of a dot product ({m}): tf32 keeps 10 mantissa bits, "
              "tf32x3 and ieee are closer to FP32"),
    Signature(PRECISION, r"allow_tf32\w*|allow_(?:fp16|bf16)_reduced_precision_reduction\w*",
              "switches TF32 or reduced-precision reductions for FP32 matmuls ({m}): lower "
              "precision than FP32"),
    Signature(PRECISION, r"float32_matmul_precision|fp32_precision|"
              r"max_num_imprecise_acc",
              "changes the precision FP32 matmuls run at ({m})"),
    Signature(PRECISION, r"torch\.backends\.\w+(?:\.\w+)*|cudnn\.(?:benchmark|deterministic)|"
              r"use_deterministic_algorithms|enable_fp_fusion|fastmath|fast_math",
              "changes a backend numerics setting ({m}): algorithm choice, determinism or "
              "precision"),
    Signature(PRECISION, r"\.(?:half|bfloat16|float|double)\(\s*\)|"
              r"\b(?:torch|np|numpy|tl|jnp|cp|cupy)\.(?:half|float|double|single)\b",
              "casts to another floating-point type ({m}): changes its precision"),
    Signature(PRECISION, words("dtype", "dtypes"),
              "changes a dtype ({m}): the precision or range values are computed in"),
    Signature(PRECISION, _DTYPE_WORDS, "changes a numeric type ({m}): a different precision "
                                       "or range"),
    Signature(PRECISION, _QUANT_WORDS, "changes quantisation ({m}): weights or activations "
                                       "lose precision"),
    Signature(PRECISION, _TOLERANCE_WORDS,
              "changes a tolerance or epsilon ({m})"),
    Signature(PRECISION, r"\b\d+(?:\.\d*)?[eE]-\d+|-\d+(?:\.\d*)?[eE]\+?\d+"
              r"|\binf\b|\bnan\b|math\.inf|float\(\s*[\"']_+[\"']\s*\)",
              "changes a small or large numeric constant ({m}): an epsilon, a mask value or "
              "a limit", weak=True),
    Signature(PRECISION, _PRECISION_WORDS, "changes a precision or rounding setting ({m})"),
    # reductions, matmuls, exponentials: their order and range set the rounding error
    Signature(ACCUMULATION, r"\btl\.(?:dot|dot_scaled|sum|max|min|reduce|cumsum|cumprod"
              r"|associative_scan|exp|exp2|log|log2|sqrt|sqrt_rn|rsqrt|fma|div_rn|fdiv|softmax"
              r"|sigmoid|argmax|argmin|xor_sum|math\.\w+|extra\.\w+(?:\.\w+)*)\b",
              "changes a Triton {m}: reductions, dots and exponentials set the kernel's "
              "rounding"),
    Signature(ACCUMULATION, r"\b(?:torch|F|np|numpy|math|jnp|cp|scipy\.special)\."
              r"(?:sum|nansum|mean|var|std|prod|cumsum|cumprod|logsumexp|softmax|log_softmax"
              r"|exp|exp2|expm1|log|log1p|log2|sqrt|rsqrt|einsum|matmul|bmm|baddbmm|addmm|mm"
              r"|dot|tensordot|linalg\.\w+|norm|layer_norm|rms_norm|group_norm|normalize"
              r"|scaled_dot_product_attention|linear|fsum|sigmoid|tanh|erf|gelu|silu|pow)\b",
              "changes a reduction, matmul or transcendental ({m}): its rounding and "
              "overflow behaviour"),
    Signature(ACCUMULATION, r"\.(?:max|min)\((?=\s*(?:dim|axis|-?\d))",
              "changes a max or min reduction ({m}): a softmax's stabiliser, a scale"),
    Signature(ACCUMULATION, r"\.(?:sum|nansum|mean|var|std|prod|cumsum|cumprod|logsumexp"
              r"|softmax|log_softmax|exp|exp_|log|log1p|sqrt|rsqrt|norm|matmul|bmm|mm|amax"
              r"|amin|float_power|pow)\(",
              "changes a reduction or transcendental ({m}): its rounding and overflow "
              "behaviour"),
    Signature(ACCUMULATION, r"\s@=?\s(?=\s*[\w(\[])",
              "changes a matrix product (@)"),
    Signature(ACCUMULATION, _ACC_WORDS + "|" + _REDUCE_WORD,
              "changes an accumulator, a reduction or a softmax ({m})", weak=True),
    Signature(ACCUMULATION, r"(?:sm|softmax|qk|attn)_scale\b",
              "changes the softmax scale ({m})", weak=True),
    Signature(ACCUMULATION, r"\btorch\.(?:empty|zeros|ones|full|empty_like|zeros_like|ones_like"
              r"|full_like|rand|randn)\b|\.(?:new_empty|new_zeros|new_ones|new_full|zero_|fill_)\(",
              "changes how a buffer is initialised ({m}): uninitialised memory or a different "
              "starting value", weak=True, extend=False),
)

# Launch configuration of Triton kernels: only in files that use Triton (elsewhere a grid
# is a plot's or a search's).
TRITON_LAUNCH: tuple[Signature, ...] = (
    Signature(KERNEL, r"\btriton\.Config\(|\bdef\s+grid\w*\(.*|\[grid\w*\]|" +
              words("grid", "num_warps", "num_stages", "num_ctas", "maxnreg", "warps", "stages",
                    "threads", "num_threads"),
              "changes a Triton kernel's launch configuration ({m}): grids, tiles and warps set "
              "how work and reductions are split"),
)

_C_TYPE_WORDS = words(
    "half", "half2", "half4", "half8", "bfloat16", "bfloat162", "bf16", "bf162", "fp16",
    "f16", "float16", "fp8", "f8", "e4m3", "e5m2", "fp4", "nvfp4", "mxfp4", "tf32", "double",
    "int8", "uint8", "int4", "fp32", "f32", "float2half", "half2float", "float2bfloat16",
    "bfloat162float", "float22half2", "half22float2", "hmma", "wmma", "wgmma", "mma",
    "opmath", "acc_t", "accscalar", "float16_t", "f16vec2", "f16vec4", "bfloat16_t",
)
_C_FAST_MATH = (
    r"\b(?:__(?:expf|exp10f|logf|log2f|log10f|powf|sinf|cosf|sincosf|tanf"
    r"|fdividef|fdivide|frcp_r[nduz]|frsqrt_rn|saturatef|tanhf)"
    r"|rsqrtf?|hexp2?|h2exp2?|hrsqrt|h2rsqrt|hrcp|h2rcp"
    r"|(?:fast_|native_)(?:exp|exp2|exp10|log|log2|pow|powr|div|divide|sqrt|rsqrt|tanh|sin|cos"
    r"|tan|recip)\w*"
    r"|half_(?:exp|log|sqrt|rsqrt|recip|divide|powr|sin|cos)\w*|__nv_fast_\w+)(?![\w])"
    r"|fast::\w+|\.approx(?:\.\w+)*|tanh\.approx"
)

C_SIGNATURES: tuple[Signature, ...] = (
    # Eighth round: a count rounded up (`ceilDiv(n, POOL)`, `DIV_ROUND_UP`, `cdiv`, `div_up`)
    # where it was rounded down, or back: whether a last partial block counts.
    Signature(PRECISION, r"\b(?:[Cc]eil_?[Dd]iv|CEIL_DIV|cdiv|"
              r"DIV_ROUND_UP|[Dd]iv_?[Uu]p|DIV_UP|iDivUp|round_up_div)\s*(?:<[^<>()]*>)?\s*\(",
              "rounds a count up or down anew ({m}): whether a last partial block or token "
              "counts, the sizes and sums computed over them", extend=False),
    Signature(SERVING, r"\b\w*(?:modify|[Ss]et|put|[Oo]verride)\w*\s*\((?:[^()\"]*,\s*)?\s*\"[A-Z]"
              r"[A-Z0-9]*_[A-Z0-9_]+\"\s*,[^;]*",
              "sets a runtime or transport setting through a configuration call ({m}): how "
              "production runs", raw=True),
    Signature(KERNEL, r"<<<[^;]*>>>",
              "changes a kernel launch configuration ({m}): grid and block sizes set how work "
              "and reductions are split"),
    Signature(FAST_MATH, _C_FAST_MATH,
              "uses an approximate math intrinsic ({m}): faster, less accurate than the "
              "IEEE function"),
    Signature(PRECISION, r"__[a-z0-9]+_r[nduz]\b",
              "uses an explicitly rounded intrinsic ({m}): a different rounding mode"),
    Signature(PRECISION, r"__float2\w+|__\w+2float\w*|__float22\w+|__half22\w+",
              "converts between half and float ({m}): where values are rounded to half"),
    Signature(PRECISION, r"__h(?:add|sub|mul|div|fma|max|min|neg|abs)\w*",
              "computes in half precision ({m}): 11-bit mantissa, overflow above 65504"),
    Signature(PRECISION, r"\b(?:ggml_(?:fp16|bf16)_t|GGML_(?:FP16|BF16|FP32|CPU_FP16|CPU_FP32)"
              r"_TO_\w+|ggml_(?:fp32|fp16|bf16)_to_\w+|GGML_TYPE_\w+|GGML_PREC_\w+|"
              r"ggml_mul_mat_set_prec|CUBLAS_COMPUTE_\w+|CUBLAS_\w*MATH\w*|cublasSetMathMode|"
              r"CUBLAS_TF32\w*|CUDA_R_\w+|cudaDataType\w*|cublasComputeType_t|"
              r"(?:at::k|torch::k|c10::k)(?:Half|BFloat16|Float|Double|Float8\w*)|ScalarType::\w+|"
              r"AT_DISPATCH_\w+|computeType|compute_type)\b",
              "changes a numeric type or compute type ({m})"),
    Signature(PRECISION, _C_TYPE_WORDS + "|" + words(
        "q2_k", "q3_k", "q4_0", "q4_1", "q4_k", "q5_0", "q5_1", "q5_k", "q6_k", "q8_0", "q8_1",
        "q8_k", "iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_nl",
        "iq4_xs", "qk_k", "qk4_0", "qk4_1", "qk5_0", "qk5_1", "qk8_0", "qk8_1") +
              r"|\bblock_q\w+|\.(?:f16|bf16|e4m3|e5m2|tf32|f32\.f16|f16\.f16)\b",
              "changes a numeric type ({m}): half precision, quantised or wider types round "
              "differently"),
    Signature(PRECISION, words("eps", "epsilon", "atol", "rtol", "precision", "prec") +
              r"|INFINITY|\bHUGE_VALF?\b|FLT_MAX|FLT_MIN|65504",
              "changes a precision setting, tolerance or limit ({m})"),
    Signature(PRECISION, r"\b\d+(?:\.\d*)?[eE]-\d+[fF]?",
              "changes a small numeric constant ({m}): an epsilon or a tolerance", weak=True),
    Signature(ACCUMULATION, r"__shfl\w*|__reduce_\w+|\bwarp_reduce\w*|\bblock_reduce\w*|"
              r"\bcub::\w+|simd_(?:sum|max|min|prefix\w*)|subgroup(?:Add|Max|Min|Inclusive\w*)|"
              r"\b(?:expf?|exp2f?|logf?|log2f?|log1pf?|sqrtf?|tanhf?|erff?|powf?|fmaf?|fmaxf?"
              r"|fminf?)\s*\(",
              "changes a reduction or a math function ({m}): its rounding"),
    Signature(ACCUMULATION, _ACC_WORDS + "|" + _REDUCE_WORD + "|" +
              words("sum", "sums", "rowsum", "row_sum", "partial_sum", "max_val", "rowmax",
                    "kqmax", "kqsum", "vkq", "scale", "norm", "rms", "mean", "variance"),
              "changes an accumulator, a reduction or a softmax ({m})", weak=True),
)

# Flags that let the compiler reorder, fuse and approximate float arithmetic. Strings count:
# they are written in build files and in setup.py's extra_compile_args.
FAST_MATH_FLAGS = Signature(
    FAST_MATH,
    r"(?i:(?:-{1,2}(?:use[_-]fast[_-]math|f?fast[_-]math|fno-fast-math|ffp-contract"
    r"(?:=\w+)?|fp-contract(?:=\w+)?|funsafe-math-optimizations|fassociative-math"
    r"|freciprocal-math|ffinite-math-only|fno-signed-zeros|fno-trapping-math|ofast|fmad(?:=\w+)?"
    r"|ftz(?:=\w+)?|prec-div(?:=\w+)?|prec-sqrt(?:=\w+)?|fp-model[= ]\w+|fcx-limited-range"
    r"|m(?:no-)?fma4?(?![\w-]))"
    r"|/fp:fast|fastmath\s*=\s*\w+|fast_math\s*=\s*\w+|use_fast_math))",
    "changes a fast-math compiler flag ({m}): the compiler may reorder and approximate float "
    "arithmetic", raw=True,
)

# Environment variables and build options that switch precision modes, in any file.
PRECISION_SWITCHES = Signature(
    PRECISION,
    r"\b(?:NVIDIA_TF32_OVERRIDE|TORCH_ALLOW_TF32_CUBLAS_OVERRIDE|TORCH_CUDNN_V8_API\w*|"
    r"CUBLAS_WORKSPACE_CONFIG|CUBLASLT_\w+|TRITON_F32_DEFAULT)\b|_(?:F16|FP16|BF16|FP8|TF32)"
    r"(?:_\w+)?\b|FORCE_(?:MMQ|CUBLAS|DMMV)\w*",
    "changes a precision switch ({m}): which precision kernels and matmuls run at", raw=True,
)

# --- Concurrency ---------------------------------------------------------------------------

_GIL = (r"Py_(?:BEGIN|END)_ALLOW_THREADS|Py_(?:BLOCK|UNBLOCK)_THREADS|PyGILState_\w+|"
        r"PyEval_(?:SaveThread|RestoreThread|AcquireThread|ReleaseThread|InitThreads)|"
        r"gil_scoped_(?:release|acquire)|call_guard|PyThreadState\w*|\bnogil\b|" +
        words("gil", "release_gil", "gil_release"))
_GIL_REASON = ("changes where the Python GIL is held or released ({m}): other Python threads "
               "run, or stop, meanwhile")

PYTHON_CONCURRENCY: tuple[Signature, ...] = (
    Signature(LOCKS, _GIL, _GIL_REASON),
    Signature(LOCKS, r"\b(?:PyDLL|CDLL|WinDLL|OleDLL|pydll|cdll|pythonapi|PYFUNCTYPE|CFUNCTYPE"
              r"|LibraryLoader)\b",
              "changes how a C library is called through ctypes ({m}): CDLL releases the GIL "
              "during a call, PyDLL holds it"),
    Signature(LOCKS, r"sys\.(?:setswitchinterval|_is_gil_enabled)|PYTHON_GIL",
              "changes how the interpreter switches threads ({m})"),
    Signature(LOCKS, words("lock", "locks", "locked", "rlock", "unlock", "mutex", "mutexes",
                           "semaphore", "spinlock", "filelock", "flock", "lockf") +
              r"|\b(?:threading|asyncio|multiprocessing|mp)\.Condition\b|\bCondition\(|"
              r"\.(?:acquire|release)\(",
              "changes locking ({m}): which code runs exclusively, and what can deadlock"),
    Signature(ATOMICS, r"\btl\.atomic_\w+|" + words("atomic", "atomics") +
              r"|\bsem\s*=\s*[\"']|\bscope\s*=\s*[\"']",
              "changes an atomic operation or its memory ordering ({m})"),
    Signature(SYNC, r"\btl\.debug_barrier\(",
              "changes a barrier between the threads of a Triton program ({m}): without it "
              "they race on shared memory"),
    Signature(SYNC, r"torch\.cuda\.synchronize|\.synchronize\(|"
              r"torch\.cuda\.(?:Stream|Event|ExternalStream|stream|current_stream"
              r"|default_stream|set_stream)|wait_stream|record_stream|wait_event|"
              r"\.record\(|non_blocking\s*=\s*\w+|" +
              r"_stream\b|\bStream\(|" +
              words("streams", "event", "events", "async_finish", "previous_event",
                    "synchronize", "fence", "barrier"),
              "changes GPU stream or event ordering ({m}): when host and device wait for "
              "each other"),
    Signature(SYNC, r"\b(?:dist|torch\.distributed|c10d)\.\w+|"
              r"\b(?:all_reduce|all_gather\w*|reduce_scatter\w*|all_to_all\w*|broadcast"
              r"|isend|irecv|batch_isend_irecv|barrier|monitored_barrier|init_process_group"
              r"|new_group|destroy_process_group)\s*\(|async_op\s*=|" +
              words("nccl", "gloo", "nvshmem", "process_group", "all_reduce", "allreduce",
                    "all_gather"),
              "changes a collective or distributed step ({m}): ordering across ranks, "
              "what can hang"),
    Signature(THREADS, r"\bthreading\.(?:Thread|Timer|Event|Barrier|local|excepthook)\b|"
              r"\b(?:Thread|Timer)\(|\bdaemon\s*=|\.join\(\s*(?:timeout\s*=[^)]*)?\)|"
              r"(?:ThreadPoolExecutor|ProcessPoolExecutor|run_in_executor|to_thread"
              r"|concurrent\.futures)\b|\b(?:n_workers|pool_size)\b|" +
              words("max_workers", "num_workers", "workers", "thread_pool", "threadpool"),
              "changes threads or executors ({m}): what runs concurrently, and how much"),
    Signature(THREADS, r"\bmultiprocessing\b|\bmp\.\w+|set_start_method|get_context\(|"
              r"\b(?:Process|Pool)\(|os\.fork|\bforkserver\b|torch\.multiprocessing|"
              r"\bspawn\(",
              "changes processes ({m}): what runs in parallel, and how state is shared"),
    Signature(THREADS, r"\b(?:queue|asyncio|mp|multiprocessing)\.(?:Queue|LifoQueue"
              r"|PriorityQueue|SimpleQueue|JoinableQueue)\b|\bQueue\(|"
              r"\bmaxsize\b(?<!lru_cache\(maxsize)(?<!LRUCache\(maxsize)(?<!TTLCache\(maxsize)" +
              r"|\.get_nowait\(|\.get\(\s*(?:block|timeout)",
              "changes a queue or its bound ({m}): back-pressure between producers and "
              "consumers"),
    Signature(THREADS, r"\bEvent\(\)|\.wait\(|\.set\(\)|\.notify(?:_all)?\(|" +
              words("timeout", "timeouts", "deadline"),
              "changes a wait, an event or a timeout ({m}): how long a thread or task "
              "waits"),
    Signature(THREADS, r"\bzmq\.\w+|\.poll\(",
              "changes inter-process messaging ({m}): how processes wait for each other"),
    Signature(THREADS, r"\b(?:time|asyncio)\.sleep\(",
              "changes a sleep ({m}): the timing between threads or tasks"),
    Signature(THREADS, r"\basyncio\.\w+|\bawait\b|\basync\s+(?:with|for)\b|\bcreate_task\(|"
              r"\bensure_future\(|call_soon_threadsafe|run_coroutine_threadsafe|"
              r"run_until_complete|new_event_loop|get_event_loop|\buvloop\b",
              "changes how coroutines are scheduled or awaited ({m})"),
)

# Host threads by name. Not in files of a kernel language, where "threads" are a block's GPU
# lanes (TileLang's T.Kernel(..., threads=128)).
PYTHON_THREAD_WORDS = Signature(
    THREADS, r"\bn_threads\b|" + words("thread", "threads", "num_threads") + r"(?!Idx)",
    "changes threads ({m}): what runs concurrently, and how much")

C_CONCURRENCY: tuple[Signature, ...] = (
    Signature(LOCKS, _GIL, _GIL_REASON),
    Signature(LOCKS, r"\b(?:lock_guard|unique_lock|scoped_lock|shared_lock"
              r"|shared_mutex|recursive_mutex|timed_mutex|condition_variable\w*|try_lock"
              r"|call_once|once_flag)\b|\bpthread_(?:mutex|cond|rwlock|spin)\w*|"
              r"CRITICAL_SECTION|\w*CriticalSection\w*|#\s*pragma\s+omp\s+critical|"
              r"ggml_critical_section\w*|" +
              words("mutex", "mutexes", "lock", "locks", "locked", "unlock", "spinlock",
                    "rwlock", "semaphore", "interlocked"),
              "changes locking ({m}): which code runs exclusively, and what can deadlock"),
    Signature(ATOMICS, ci_word("atomic") + r"\w*|" + ci_word("memory_order") + r"\w*|"
              r"__threadfence\w*|\bvolatile\b(?<!asm volatile)(?<!__asm__ volatile)(?!\s*\()|"
              r"\bfence\.\w+|\bmembar\.\w+|\b(?:ld\.|st\.|red\.|atom\.)(?:acquire|release|relaxed"
              r"|volatile|acq_rel|sc|global\.add|shared\.add|add)\w*|\bcuda::atomic_ref\b|"
              r"InterlockedIncrement\w*|InterlockedCompareExchange\w*|"
              r"\b(?:ld_|st_|red_|atom_)\w*(?:acquire|release|relaxed|volatile)\w*|"
              r"\w*memory_fence\w*|\bfence_\w+|\bmultimem\.[\w.]+",
              "changes an atomic operation or memory ordering ({m}): what other threads can "
              "observe and when"),
    Signature(SYNC, r"__syncthreads\w*|__syncwarp|__syncblocks|__barrier_sync|"
              r"threadgroup_barrier|simdgroup_barrier|subgroupBarrier|\w*memoryBarrier\w*|"
              r"work_group_barrier|mbarrier\w*|\bbar\.(?:sync|arrive)\b|"
              r"\bbarrier\.sync\b|\bbarrier\s*\(\s*\)|cooperative_groups|\bcg::\w*sync\w*|"
              r"\bgrid\.sync\(|this_grid\(\)\.sync|\bcuda::(?:barrier|pipeline)\w*|"
              r"__pipeline_\w+|cp\.async\.(?:wait|commit)\w*|cp_async_wait\w*|"
              r"ggml_cuda_pdl_sync|griddepcontrol\w*|cudaGridDependencySynchronize",
              "changes a barrier between GPU threads ({m}): without it threads race on "
              "shared memory"),
    # Eighth round: a project's own barrier (composable_kernel's `block_sync_lds()`, a
    # `group_barrier()`): a call named `sync` or `barrier` as a snake_case word; not a warp
    # shuffle or vote (`__shfl_xor_sync`), whose names start with two underscores.
    Signature(SYNC, r"(?<![\w.>:])(?!__)(?:[A-Za-z]\w*_)?(?:sync|barrier)(?:_\w+)?\s*\(\s*\)",
              "changes a barrier between GPU threads ({m}): without it threads race on "
              "shared memory"),
    # Eighth round: an inline asm's "memory" clobber (`asm volatile("" ::: "memory")`, `:
    # "cc", "memory")`): the compiler may no longer keep memory in registers or move loads and
    # stores across the statement, a compiler barrier.
    Signature(ATOMICS, r":\s*(?:\"\w+\"\s*,\s*)*\"memory\"",
              "changes an inline asm's memory clobber ({m}): whether the compiler may move "
              "loads and stores across it, what other threads observe", raw=True),
    # Eighth round: a timeout spelled as a duration type (`std::chrono::duration<double,
    # std::milli>(6000.0)`, `std::chrono::seconds(5)`, `absl::Seconds(5)`).
    Signature(THREADS, r"\bstd::chrono::(?:duration\s*<[^;]*?>|\w*seconds|minutes|hours)\s*[({]|"
              r"\babsl::(?:Seconds|Milliseconds|Microseconds|Minutes)\s*\(",
              "changes a duration ({m}): how long a thread waits before it gives up or polls "
              "again"),
    # Eighth round: a transport's setting set through a configuration call
    # (`config.modify("RC_FENCE", "none")`, `ucp_config_modify(cfg, "TLS", "rc")`); a key
    # whose words say fence, ordering, threads, sync, locks or atomics decides what waits.
    Signature(SYNC, r"\b\w*(?:modify|[Ss]et|put|[Oo]verride)\w*\s*\((?:[^()\"]*,\s*)?\s*"
              r"\"[A-Z0-9_]*"
              r"(?:FENCE|ORDER|ORDERING|THREAD|THREADS|THREADING|SYNC|LOCK|ATOMIC|ATOMICS|"
              r"PROGRESS|BLOCKING|WAIT)(?:_[A-Z0-9_]*)?\"",
              "sets a transport's ordering or threading ({m}): what a peer sees and when",
              raw=True),
    # The current device is a host thread's own: a worker thread starts on device 0.
    Signature(THREADS, r"\b(?:cuda|hip)SetDevice\b",
              "changes which device a host thread works on ({m}): each thread has its own "
              "current device, and a worker's copies and launches go to it"),
    Signature(SYNC, r"\b(?:cuda|hip|cu)(?:Stream|Event)\w*|\b(?:cuda|hip)DeviceSynchronize|"
              r"\b(?:cuda|hip)Mem(?:cpy|set)\w*Async|"
              r"cudaLaunchHostFunc|getCurrentCUDAStream|\bCUDAStream\w*|at::cuda::\w*Stream\w*|"
              r"c10::cuda::\w*Stream\w*|ggml_backend_\w*synchronize\w*|ggml_barrier|"
              r"\bnccl\w+|\bnvshmemx?_\w+|\bMPI_\w+|" +
              r"\b\w+\.sync\(\s*\)|" +
              words("stream", "streams", "event", "events", "synchronize", "barrier", "nccl",
                    "nvshmem"),
              "changes stream, event or collective ordering ({m}): when host, device and "
              "ranks wait for each other"),
    Signature(THREADS, r"\bstd::(?:thread|jthread|async|future|promise|launch|this_thread)\b|"
              r"\bpthread_(?:create|join|detach|barrier\w*)\b|\.(?:detach|join)\(\s*\)|"
              r"\b(?:sleep_for|sleep_until|usleep|nanosleep|wait_for|wait_until)\s*\(|"
              r"#\s*pragma\s+omp\b|\bomp_\w+|\btbb::\w+|\bThreadPool\b|\bthread_pool\b|" +
              words("timeout", "timeouts"),
              "changes threads or waits ({m}): what runs concurrently on the host"),
)

# --- Production ------------------------------------------------------------------------------

# GPU architectures a binary is compiled for: an arch list or variable (not a namespace such as
# cutlass::arch, nor the __CUDA_ARCH__ a kernel branches on), sm_90a, compute_80, gfx942, a
# quoted "100a".
GPU_ARCH = (r"(?<![.:>])\b\w*(?<![A-Za-z])[Aa]rch(?:s|_list|itectures?)?\b(?!\s*(?:::|\.))|"
            r"\b(?:sm|compute)_\d{2,3}[af]?\b|\bgfx\d{3,4}\w*|\bgencode\b|"
            r"""(?<=["'])\d{2,3}[af](?=["'])|\b[A-Z_]*ARCH(?:S|_LIST)(?:_[A-Z]+)*\b|"""
            # a build's compute capabilities: build_capability="75;80;90", CUDA_CAPABILITIES
            r"""\b\w*(?<![A-Za-z])(?:capability|capabilities|CAPABILITY|CAPABILITIES)\b"""
            r"""(?=\s*[=:]|["'])""")

STRONG_FLAG = (
    r"--?(?:(?:tensor|pipeline|data|expert|context|sequence)[-_]parallel(?:[-_]size)?"
    r"|enable[-_]expert[-_]parallel|(?:tp|pp|dp|ep|cp)(?:[-_]size)?|max[-_]num[-_](?:batched"
    r"[-_]tokens|seqs)|max[-_]model[-_]len|gpu[-_]memory[-_]utili[sz]ation|mem[-_]fraction"
    r"[-_]static|kv[-_]cache[-_]dtype|quantization|quantize|quant[-_]method|max[-_]running"
    r"[-_]requests|max[-_]total[-_]tokens|max[-_]prefill[-_]tokens|chunked[-_]prefill[-_]size"
    r"|enable[-_]chunked[-_]prefill|max[-_]batch[-_](?:total|prefill)[-_]tokens|max[-_]batch"
    r"[-_]size|cuda[-_]graph[-_]\w+|enable[-_]dp[-_]attention|num[-_]speculative[-_]tokens"
    r"|speculative[-_][\w-]+|swap[-_]space|cpu[-_]offload[-_]gb|max[-_]concurrent[-_]requests"
    r"|max[-_]input[-_](?:length|tokens)|max[-_]seq[-_]len\w*|n[-_]gpu[-_]layers|ngl"
    r"|enforce[-_]eager|disable[-_]cuda[-_]graph|enable[-_]prefix[-_]caching|disable[-_]radix"
    r"[-_]cache|attention[-_]backend|[\w-]*attention[-_]backend|served[-_]model[-_]name"
    r"|nproc[-_]per[-_]node|nnodes|node[-_]rank|dist[-_]init[-_]addr|ctx[-_]size|ubatch[-_]size"
    r"|batch[-_]size|cont[-_]batching|context[-_]length|max[-_]loras|max[-_]lora[-_]rank"
    r"|block[-_]size|num[-_]gpu[-_]blocks[-_]override|dtype|load[-_]format|max[-_]num[-_]tokens"
    r"|distributed[-_]executor[-_]backend|kv[-_]transfer[-_]config|disaggregation[-_][\w-]+"
    r"|moe[-_][\w-]+|deepep[-_][\w-]+|max[-_]queued[-_]requests|schedule[-_][\w-]+)(?![\w-])"
)
ENTRYPOINT = (
    r"\bvllm\s+serve\b|\bvllm\.entrypoints\b|\bsglang\.launch_server\b|-m\s+sglang\b|"
    r"\bsglang_router\b|\bsglang\.srt\.\w+|\bllama-server\b|\bllama\.cpp/server\b|"
    r"\btext-generation-(?:launcher|server)\b|\btrtllm-(?:serve|build)\b|\btritonserver\b|"
    r"\btorchrun\b|torch\.distributed\.(?:run|launch)\b|\bdeepspeed\s+(?:--|[\w./-]+\.py)|"
    r"\baccelerate\s+launch\b|"
    r"\blmdeploy\s+serve\b|\bmlc_llm\s+serve\b|\bollama\s+serve\b|\bray\s+(?:start|serve|job)\b|"
    r"\bserve\s+run\b|\buvicorn\b|\bgunicorn\b|\bhypercorn\b|\bdynamo\s+(?:serve|run)\b|"
    r"\bkubectl\s+(?:apply|set|rollout|scale|patch|create|delete)\b|\bhelm\s+(?:upgrade|install)\b|"
    r"\bterraform\s+apply\b|\bdocker\s+(?:push|run)\b|\bdocker\s+compose\s+up\b|"
    r"\bpython3?\s+(?:-u\s+)?-m\s+[\w.]*serv\w*|\bpython3?\s+(?:-u\s+)?[\w./-]*"
    r"(?:serve|server|launch)\w*\.py\b"
)
# Environment variables that configure a serving engine or its collectives.
SERVING_ENV_NAME = (
    r"(?:VLLM|SGLANG|SGL|NCCL|NVSHMEM|TORCH_NCCL|TORCH_DISTRIBUTED|PYTORCH_CUDA|CUDA_"
    r"VISIBLE_DEVICES|CUDA_DEVICE_MAX_CONNECTIONS|CUDA_LAUNCH_BLOCKING|OMP_NUM_THREADS|TGI|"
    r"LLAMA_ARG|UCX|GLOO|MASTER_ADDR|MASTER_PORT|WORLD_SIZE|NNODES|NODE_RANK|DEEPEP|MOONCAKE|"
    r"NIXL|HF_HUB_OFFLINE|TRANSFORMERS_OFFLINE|TOKENIZERS_PARALLELISM)(?:_\w+)?"
)
SERVING_ENV = rf"\b{SERVING_ENV_NAME}\s*="

_KEY_WORDS = (
    r"\w*parallel\w*|(?:tp|pp|dp|ep|cp|sp)(?:_size)?|world_size|\w*gpus?\w*|nproc\w*|nnodes|"
    r"num_nodes|\w*batch\w*|\w*tokens?\w*|max_\w+|min_\w+|\w*seqs|\w*seq_len\w*|"
    r"\w*context_len\w*|ctx_size|n_ctx|\w*model_len|\w*prefill\w*|\w*decode\w*|\w*queue\w*|"
    r"\w*concurren\w*|\w*limits?|\w*rate_limit\w*|\w*quant\w*|\w*dtype|load_format|"
    r"kv_cache\w*|\w*cache\w*|\w*memory\w*|mem_\w+|\w*_mem|\w*offload\w*|swap_space|"
    r"block_size|num_\w*blocks\w*|\w*timeout\w*|keep_?alive\w*|deadline|ttl|\w*retries|"
    r"\w*retry\w*|grace\w*|replicas|\w*replica\w*|\w*workers?|\w*threads?|\w*processes|"
    r"autoscal\w*|instances|port|host|model|model_\w+|\w*_model|served_model_name|revision|"
    r"tokenizer\w*|enforce_eager|\w*cuda_graph\w*|\w*speculat\w*|\w*draft\w*|\w*backend|"
    r"\w*schedul\w*|enable_\w+|disable_\w+|\w*prefix_caching\w*|cpu|resources|requests|image|"
    r"\w*lora\w*|\w*expert\w*|\w*attention\w*|\w*kv_\w+|\w*spec_\w+|num_\w+|n_\w+|\w*size"
)
SERVING_KEY = re.compile(rf"(?:{_KEY_WORDS})")
# Precision modes in configuration are numerics, not just serving settings.
NUMERIC_KEY = re.compile(r"(?:\w*allow_tf32\w*|\w*tf32\w*|\w*matmul_precision\w*|"
                         r"input_precision|fp32_precision|\w*fast_?math\w*|deterministic\w*|"
                         r"\w*fp_fusion\w*|precision|\w*_eps|eps|\w*epsilon|\w*atol|\w*rtol)")

# Python defaults and assignments of serving limits (an engine's server_args, a launcher).
PYTHON_SERVING = Signature(
    SERVING,
    _kw(r"(?:tensor|pipeline|data|expert)_parallel_size", "tp_size", "pp_size", "dp_size",
        "ep_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
        "gpu_memory_utili[sz]ation", "mem_fraction_static", "max_running_requests",
        "max_total_tokens", "max_prefill_tokens", "chunked_prefill_size", "cuda_graph_max_bs",
        "cuda_graph_bs", "max_batch_size", "swap_space", "cpu_offload_gb",
        "num_gpu_blocks_override", "max_seq_len_to_capture", "enable_chunked_prefill",
        "enforce_eager", "max_concurrency", "max_queued_requests", "max_loras",
        "max_batch_total_tokens", "max_batch_prefill_tokens", "max_input_length",
        "max_waiting_requests", "max_num_tokens", "num_scheduler_steps"),
    "changes a serving limit or parallel size ({m}): how production batches and shards "
    "requests",
)
