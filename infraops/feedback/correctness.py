"""Correctness feedback: per-case comparison of reference and candidate outputs. Pure: numpy only.

A probe writes one output per case into ``INFRAOPS_OUT/outputs/``: ``<case>.npy`` (an array) or
``<case>.json`` (any JSON value). Two such folders, written by the same probe on the same inputs
under two variants (``cp=off`` as the reference, ``cp=on`` as the candidate) or on the baseline and
the candidate commit, are compared case by case.

A case may carry the size it ran at (a context length, a batch), given in any of three ways; the
first that yields a finite number (not a boolean) wins, in this order:

1. ``<case>.meta.json`` = ``{"size": 4096}``: the reference's, else the candidate's;
2. a ``"size"`` field of the case's JSON output when that output is an object
   (``<case>.json`` = ``{"size": 4096, "logits": [...]}``): the reference's, else the
   candidate's. The reference is the trusted side; the candidate's is the fallback. The field
   stays part of the compared output;
3. ``sizes[case]``, passed to ``compare_output_dirs`` by the caller: typically
   ``sizes_from_labels`` over the probe's metric rows, for rows labelled ``{"size": 4096}``.

- ``compare_output_dirs`` pairs the files by case name and returns one ``CaseComparison`` each;
- ``sizes_from_labels`` turns metric rows' ``size`` labels into that ``sizes`` mapping;
- ``compare_arrays`` / ``compare_json`` compare one pair with ``numpy.isclose`` semantics:
  an element matches when ``|candidate - reference| <= atol + rtol * |reference|``, NaN matches
  NaN at the same place, an infinity matches the same infinity;
- ``error_series`` lines the errors up against the cases' sizes: the curve that exposes a
  precision loss accumulating with size (a TF32 dot in a context-parallel merge).

The folders are written by untrusted probes: symlinks, FIFOs and other non-regular files are
refused, never followed or opened for reading; sizes are capped before anything is read; ``.npy``
files holding Python objects (pickles) are refused; a header that promises more data than the file
holds is refused before numpy allocates it.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

STATUSES = (
    "match", "mismatch", "shape-mismatch", "dtype-mismatch",
    "missing-reference", "missing-candidate", "unreadable",
)
OUTPUT_SUFFIXES = (".npy", ".json")
META_SUFFIX = ".meta.json"
META_MAX_BYTES = 64 << 10
# Elements compared per step: bounds the float64 temporaries whatever the output's size.
_CHUNK = 1 << 18

JsonPath = tuple[int | str, ...]
_N = TypeVar("_N", int, float)


@dataclass(frozen=True)
class CaseComparison:
    """One case's reference and candidate outputs compared.

    ``status`` is one of ``STATUSES``; only ``"match"`` means the outputs are equivalent.
    ``shape`` and ``dtype`` are the reference's (``dtype`` is ``"json"`` for JSON outputs,
    ``None`` when the reference is missing or unreadable). ``max_abs_error`` and
    ``max_rel_error`` are over the element pairs where both values are finite (the relative one
    only where the reference is non-zero); ``None`` when no such pair was compared. ``max_ulp``
    is the largest distance in units in the last place between equal-dtype float16/32/64
    arrays, over the pairs where neither is NaN (+0 and -0 are 0 apart, the largest finite value
    and infinity 1 apart); ``None`` for other outputs. ``mismatches`` counts compared elements
    outside tolerance (0 when nothing could be compared: see ``status``); ``first_mismatch`` is
    the first of them, a C-order index for arrays and a key/index path for JSON, with
    ``first_values`` = (reference, candidate) when both are real numbers. ``detail`` is one
    sentence naming the case.
    """

    case: str
    status: str
    shape: tuple[int, ...] | None
    dtype: str | None
    max_abs_error: float | None
    max_rel_error: float | None
    max_ulp: int | None
    mismatches: int
    first_mismatch: tuple[int | str, ...] | None
    first_values: tuple[float, float] | None
    size: float | None
    detail: str

    @property
    def ok(self) -> bool:
        return self.status == "match"

    def as_dict(self) -> dict[str, object]:
        """Plain JSON values (tuples as lists); a non-finite float becomes "nan", "inf", "-inf"
        so that the result stays valid strict JSON (PostgreSQL's jsonb rejects NaN)."""
        return {field.name: _plain(getattr(self, field.name)) for field in fields(self)}


@dataclass(frozen=True)
class ErrorSeries:
    """Errors against case sizes. ``points`` are (size, error), sorted by size, one per size
    (the worst case at that size). ``slope`` is the least-squares slope of log(error) against
    log(size) over the points where both are positive (``None`` with fewer than two).
    ``growing`` is True only with evidence: at least ``SERIES_MIN_POINTS`` sizes, a slope of at
    least ``SERIES_MIN_SLOPE`` and a Spearman rank correlation of at least ``SERIES_MIN_RHO``.
    """

    points: tuple[tuple[float, float], ...]
    slope: float | None
    growing: bool
    detail: str
    metric: str = "max_rel_error"
    rho: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {field.name: _plain(getattr(self, field.name)) for field in fields(self)}


# Slope 0.25: an error that doubles for every 16x in size. Round-to-nearest TF32 dots in an
# emulated KDA context-parallel merge measured 0.3-0.5 in max relative error over 256..65536
# tokens (errors add up like a random walk; truncation instead of rounding gives ~1); an
# elementwise float64 kernel, whose error does not accumulate, measured ~0.1 (the maximum over
# more elements creeps up). With 5 sizes rho >= 0.8 allows one adjacent pair out of order; with
# 4 it demands a monotone curve.
SERIES_MIN_POINTS = 4
SERIES_MIN_SLOPE = 0.25
SERIES_MIN_RHO = 0.8
SERIES_METRICS = {
    "max_rel_error": "max relative error",
    "max_abs_error": "max absolute error",
    "max_ulp": "max ULP distance",
}


def compare_arrays(
    case: str, reference: npt.ArrayLike, candidate: npt.ArrayLike, *,
    rtol: float, atol: float, size: float | None = None,
) -> CaseComparison:
    """Compare two arrays element by element (see the module docstring for the tolerance).

    Different shapes give ``"shape-mismatch"`` with nothing compared. Different dtypes give
    ``"dtype-mismatch"``; when both are numeric (bool excluded) the values are still compared,
    in a common precision, so the detail says how far apart they are. Byte order is not part of
    the dtype. Integers are compared exactly before tolerance applies (unequal ones are at least
    1 apart). Non-numeric arrays (bool, strings, records, datetimes) are compared with ``==``.
    Raises ValueError for a negative or non-finite tolerance.
    """
    _check_tolerances(rtol, atol)
    ref, cand = _native(np.asarray(reference)), _native(np.asarray(candidate))
    shape, dtype = tuple(int(n) for n in ref.shape), str(ref.dtype)

    def result(status: str, detail: str, scan: _Scan | None = None) -> CaseComparison:
        first = None if scan is None or scan.first is None else _unravel(scan.first, shape)
        return CaseComparison(
            case=case, status=status, shape=shape, dtype=dtype,
            max_abs_error=scan.max_abs if scan else None,
            max_rel_error=scan.max_rel if scan else None,
            max_ulp=scan.max_ulp if scan else None,
            mismatches=scan.count if scan else 0, first_mismatch=first,
            first_values=_first_values(ref, cand, scan.first) if scan else None,
            size=_float_or_none(size), detail=f"case {case}: {detail}",
        )

    if ref.shape != cand.shape:
        return result("shape-mismatch", f"shape differs: reference {shape} {dtype}, "
                                        f"candidate {tuple(cand.shape)} {cand.dtype}")
    numeric = _is_numeric(ref.dtype) and _is_numeric(cand.dtype)
    if ref.dtype != cand.dtype and not numeric:
        return result("dtype-mismatch",
                      f"dtype differs: reference {dtype}, candidate {cand.dtype}; not compared")
    scan = _scan(ref, cand, rtol=rtol, atol=atol, numeric=numeric)
    summary = _array_summary(ref, cand, scan, rtol=rtol, atol=atol)
    if ref.dtype != cand.dtype:
        return result("dtype-mismatch",
                      f"dtype differs: reference {dtype}, candidate {cand.dtype}; {summary}", scan)
    return result("mismatch" if scan.count else "match", summary, scan)


def compare_json(
    case: str, reference: object, candidate: object, *,
    rtol: float, atol: float, size: float | None = None,
) -> CaseComparison:
    """Compare two JSON values leaf by leaf, in document order (the reference's keys first).

    Numbers (not booleans) match within tolerance, NaN matches NaN; everything else must be
    equal and of the same JSON type. A key or list item present on one side only is one
    mismatched leaf. ``first_mismatch`` is the path of the first differing leaf, e.g.
    ``("tokens", 3)``; ``()`` is the root. Lists and tuples are both JSON arrays.
    """
    _check_tolerances(rtol, atol)
    leaves = count = 0
    first: JsonPath | None = None
    first_pair: tuple[object, object] = (None, None)
    max_abs: float | None = None
    max_rel: float | None = None
    for path, ref, cand in _json_leaves(reference, candidate):
        leaves += 1
        close, abs_error, rel_error = _json_leaf_close(ref, cand, rtol=rtol, atol=atol)
        max_abs, max_rel = _max(max_abs, abs_error), _max(max_rel, rel_error)
        if not close:
            count += 1
            if first is None:
                first, first_pair = path, (ref, cand)
    if first is None:
        detail = f"all {leaves} JSON values match"
    else:
        detail = (f"{count} of {leaves} JSON values differ; first at {_json_path(first)}: "
                  f"{_json_show(first_pair[0])} vs {_json_show(first_pair[1])}")
    return CaseComparison(
        case=case, status="mismatch" if count else "match", shape=None, dtype="json",
        max_abs_error=max_abs, max_rel_error=max_rel, max_ulp=None, mismatches=count,
        first_mismatch=first,
        first_values=None if first is None else _json_number_pair(*first_pair),
        size=_float_or_none(size), detail=f"case {case}: {detail}",
    )


def load_output(path: Path, *, max_bytes: int) -> npt.NDArray[Any] | object:
    """Read one output file: ``.npy`` as an array (pickled object arrays refused), ``.json`` as
    a JSON value. Raises ValueError, with a message naming the file, for any other name, a
    symlink, anything but a regular file, a file over ``max_bytes``, or unparsable content."""
    return _load(str(path), dir_fd=None, label=str(path), max_bytes=max_bytes)


def compare_output_dirs(
    reference_dir: Path, candidate_dir: Path, *, rtol: float, atol: float,
    sizes: Mapping[str, float] | None = None, max_bytes: int = 256 << 20,
) -> list[CaseComparison]:
    """Compare every case found in either folder; one ``CaseComparison`` per case, in natural
    order of the case names (``case2`` before ``case10``).

    A case is ``<case>.npy`` or ``<case>.json``; ``<case>.meta.json`` files are metadata, other
    names are ignored. A case present on one side only is ``missing-reference`` or
    ``missing-candidate``; an unreadable file (symlink, oversize, not a regular file, bad
    content, both a ``.npy`` and a ``.json``) makes the case ``unreadable`` with the reason; an
    array on one side and JSON on the other is a ``dtype-mismatch``.

    A case's size is the first usable one of: the reference's meta file, the candidate's; the
    ``"size"`` field of the reference's JSON output (when it is an object), the candidate's;
    ``sizes[case]``. A usable size is a finite number, not a boolean; anything else (a malformed
    meta file, ``"size": "4096"``, NaN) is passed over for the next source, and a case that none
    of them sizes has size None. A folder that does not exist holds no cases; raises ValueError
    when a folder is a symlink or not a folder.
    """
    _check_tolerances(rtol, atol)
    with _Folder(reference_dir, "reference") as ref, _Folder(candidate_dir, "candidate") as cand:
        cases = sorted(set(ref.outputs) | set(cand.outputs), key=natural_key)
        return [
            _compare_case(case, ref, cand, rtol=rtol, atol=atol,
                          given=_finite_number(sizes.get(case)) if sizes else None,
                          max_bytes=max_bytes)
            for case in cases
        ]


def sizes_from_labels(rows: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, float]:
    """Case -> size from metric rows' ``labels["size"]``, for ``compare_output_dirs(sizes=)``.

    ``rows`` are (case, labels) pairs, one per metric row. A size is a finite number (not a
    boolean) or a string spelling one in decimal (``"4096"``, ``" 1.5e3 "``); rows with an empty
    case, no size or an unusable one are skipped. The first size seen for a case is kept while
    later rows agree with it (equal as floats: ``4096`` and ``"4096.0"`` agree); a case given two
    different sizes gets none at all, since which one is right cannot be told.
    """
    found: dict[str, float] = {}
    conflicting: set[str] = set()
    for case, labels in rows:
        if not case or case in conflicting or not isinstance(labels, Mapping):
            continue
        size = _label_size(labels.get("size"))
        if size is None:
            continue
        if case not in found:
            found[case] = size
        elif found[case] != size:
            del found[case]
            conflicting.add(case)
    return found


def error_series(
    comparisons: Sequence[CaseComparison], *, metric: str = "max_rel_error",
) -> ErrorSeries:
    """Line ``metric`` (``max_rel_error``, ``max_abs_error`` or ``max_ulp``) up against the
    cases' sizes; cases without a size or without that error are left out. See ``ErrorSeries``
    for when the error counts as growing. Raises ValueError for an unknown metric."""
    if metric not in SERIES_METRICS:
        raise ValueError(f"unknown metric {metric!r}; one of {', '.join(SERIES_METRICS)}")
    label = SERIES_METRICS[metric]
    worst: dict[float, float] = {}
    for comparison in comparisons:
        value = getattr(comparison, metric)
        if comparison.size is None or value is None or not math.isfinite(comparison.size):
            continue
        size = float(comparison.size)
        worst[size] = max(float(value), worst.get(size, -math.inf))
    points = tuple(sorted(worst.items()))

    def series(growing: bool, detail: str, slope: float | None = None,
               rho: float | None = None) -> ErrorSeries:
        return ErrorSeries(points=points, slope=slope, growing=growing, detail=detail,
                           metric=metric, rho=rho)

    if not points:
        return series(False, f"no case carries both a size and a {label}")
    span = (f"{_num(points[0][1])} at {_size(points[0][0])} to "
            f"{_num(points[-1][1])} at {_size(points[-1][0])}")
    if all(error == 0 for _, error in points):
        return series(False, f"{label} is 0 at every size ({len(points)} sizes, "
                             f"{_size(points[0][0])} to {_size(points[-1][0])})")
    slope, rho = _log_log_slope(points), _spearman(points)
    fit = (f"slope {_fmt(slope, '.2f')} in log-log, Spearman rho {_fmt(rho, '.2f')}, "
           f"{len(points)} sizes")
    if len(points) < SERIES_MIN_POINTS:
        return series(False, f"too few sizes to judge growth ({len(points)}, "
                             f"{SERIES_MIN_POINTS} needed): {label} {span}", slope, rho)
    growing = (slope is not None and slope >= SERIES_MIN_SLOPE
               and rho is not None and rho >= SERIES_MIN_RHO)
    verdict = f"{label} grows with size" if growing else f"no evidence that {label} grows with size"
    return series(growing, f"{verdict}: {span} ({fit})", slope, rho)


# --- arrays -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scan:
    count: int
    first: int | None  # flat C-order index
    max_abs: float | None
    max_rel: float | None
    max_ulp: int | None


def _scan(
    ref: npt.NDArray[Any], cand: npt.NDArray[Any], *, rtol: float, atol: float, numeric: bool,
) -> _Scan:
    """Walk both arrays in C order, a chunk at a time, and tally the mismatches and errors."""
    ref_flat, cand_flat = ref.reshape(-1), cand.reshape(-1)
    work = np.result_type(ref.dtype, cand.dtype, np.float64) if numeric else None
    ulp = ref.dtype == cand.dtype and ref.dtype.kind == "f" and ref.dtype.itemsize in (2, 4, 8)
    count, first = 0, None
    max_abs: float | None = None
    max_rel: float | None = None
    max_ulp: int | None = None
    for start in range(0, ref_flat.size, _CHUNK):
        r, c = ref_flat[start:start + _CHUNK], cand_flat[start:start + _CHUNK]
        if work is None:
            close = _exact_close(r, c)
        else:
            close, chunk_abs, chunk_rel = _numeric_close(r, c, work, rtol=rtol, atol=atol)
            max_abs, max_rel = _max(max_abs, chunk_abs), _max(max_rel, chunk_rel)
        if ulp:
            max_ulp = _max(max_ulp, _max_ulp(r, c))
        bad = int(np.count_nonzero(~close))
        if bad and first is None:
            first = start + int(np.argmax(~close))
        count += bad
    return _Scan(count=count, first=first, max_abs=max_abs, max_rel=max_rel, max_ulp=max_ulp)


def _numeric_close(
    ref: npt.NDArray[Any], cand: npt.NDArray[Any], work: np.dtype[Any], *,
    rtol: float, atol: float,
) -> tuple[npt.NDArray[np.bool_], float | None, float | None]:
    """Which pairs match, and the largest absolute and relative error among finite pairs."""
    r, c = ref.astype(work, copy=False), cand.astype(work, copy=False)
    with np.errstate(all="ignore"):
        diff = np.abs(c - r)
        if ref.dtype.kind in "iu" and cand.dtype.kind in "iu":
            # float64 cannot tell 2**60 from 2**60 + 1; the integers themselves can.
            equal = ref == cand
            diff = np.where(equal, 0.0, np.maximum(diff, 1.0))
        else:
            equal = (r == c) | (np.isnan(r) & np.isnan(c))
        scale = np.abs(r)
        finite = np.isfinite(r) & np.isfinite(c)
        close = equal | (finite & (diff <= atol + rtol * scale))
        finite_diff = diff[finite]
        nonzero = finite & (scale > 0)
        rel = diff[nonzero] / scale[nonzero]
    return (
        np.asarray(close, dtype=np.bool_),
        float(finite_diff.max()) if finite_diff.size else None,
        float(rel.max()) if rel.size else None,
    )


def _exact_close(ref: npt.NDArray[Any], cand: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    if ref.dtype.kind in "Mm" and ref.dtype == cand.dtype:
        ref, cand = ref.view(np.int64), cand.view(np.int64)  # so that NaT matches NaT
    try:
        equal = np.asarray(ref == cand)
    except (TypeError, ValueError):
        equal = np.zeros(ref.shape, dtype=np.bool_)
    if equal.shape != ref.shape:  # == gave up on these dtypes: nothing is known to match
        equal = np.zeros(ref.shape, dtype=np.bool_)
    return equal.astype(np.bool_, copy=False)


def _max_ulp(ref: npt.NDArray[Any], cand: npt.NDArray[Any]) -> int | None:
    """Largest ULP distance between same-dtype floats; pairs with a NaN are left out, except
    that NaN against NaN is 0 apart. ``None`` when no pair is left."""
    ints, uints = np.dtype(f"i{ref.dtype.itemsize}"), np.dtype(f"u{ref.dtype.itemsize}")
    ref_key, cand_key = _ordered_bits(ref.view(ints)), _ordered_bits(cand.view(ints))
    # Keys span nearly the whole signed range: their difference is taken modulo 2**bits in the
    # unsigned type, where it is exact because it is below 2**bits.
    with np.errstate(all="ignore"):
        distance = np.where(ref_key >= cand_key, ref_key.view(uints) - cand_key.view(uints),
                            cand_key.view(uints) - ref_key.view(uints))
    ref_nan, cand_nan = np.isnan(ref), np.isnan(cand)
    distance = distance[~(ref_nan | cand_nan)]
    if distance.size:
        return int(distance.max())
    return 0 if bool(np.any(ref_nan & cand_nan)) else None


def _ordered_bits(bits: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Map IEEE bit patterns (as signed integers) to integers in the floats' order; +0 and -0
    both map to 0, so adjacent floats are 1 apart across zero too."""
    lowest = bits.dtype.type(np.iinfo(bits.dtype).min)
    return np.where(bits < 0, lowest - bits, bits)


def _array_summary(
    ref: npt.NDArray[Any], cand: npt.NDArray[Any], scan: _Scan, *, rtol: float, atol: float,
) -> str:
    errors = ", ".join(
        text for text in (
            f"max abs {_num(scan.max_abs)}" if scan.max_abs is not None else "",
            f"max rel {_num(scan.max_rel)}" if scan.max_rel is not None else "",
            f"max {scan.max_ulp} ULP" if scan.max_ulp is not None else "",
        ) if text
    )
    if scan.first is None:
        if not scan.max_abs:
            return f"all {ref.size} elements equal"
        return f"all {ref.size} elements match within rtol {rtol:g}, atol {atol:g} ({errors})"
    index = _unravel(scan.first, tuple(ref.shape))
    r, c = ref.reshape(-1)[scan.first], cand.reshape(-1)[scan.first]
    at = [f"abs {_num(_abs_error(r, c))}"] if _both_finite_real(r, c) else []
    if scan.max_ulp is not None and not (np.isnan(r) or np.isnan(c)):
        at.append(f"{_max_ulp(np.asarray([r]), np.asarray([c]))} ULP")
    # str(), not format(): numpy scalars print the shortest digits that identify their own
    # dtype's value, where format() would print a float32 with float64's 17 digits.
    return (f"{scan.count} of {ref.size} elements differ; first at {_index(index)}: "
            f"{r!s} vs {c!s}"
            + (f" ({', '.join(at)})" if at else "")
            + (f"; {errors}" if errors else "") + f" (rtol {rtol:g}, atol {atol:g})")


def _first_values(
    ref: npt.NDArray[Any], cand: npt.NDArray[Any], first: int | None,
) -> tuple[float, float] | None:
    if first is None or not (_is_real(ref.dtype) and _is_real(cand.dtype)):
        return None
    return float(ref.reshape(-1)[first]), float(cand.reshape(-1)[first])


def _abs_error(r: Any, c: Any) -> float:
    if isinstance(r, np.integer) and isinstance(c, np.integer):
        return float(abs(int(c) - int(r)))
    return abs(float(c) - float(r))


def _both_finite_real(r: Any, c: Any) -> bool:
    return (_is_real(np.asarray(r).dtype) and _is_real(np.asarray(c).dtype)
            and bool(np.isfinite(r)) and bool(np.isfinite(c)))


def _is_numeric(dtype: np.dtype[Any]) -> bool:
    return dtype.kind in "iufc"


def _is_real(dtype: np.dtype[Any]) -> bool:
    return dtype.kind in "iuf"


def _native(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    if array.dtype.byteorder not in ("=", "|") and not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="))
    return array


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def _index(index: Sequence[int]) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]"


# --- JSON ---------------------------------------------------------------------------------

_MISSING = object()


def _json_leaves(reference: object, candidate: object) -> Iterator[tuple[JsonPath, object, object]]:
    """Pairs of leaves in document order; an explicit stack, since JSON may nest deeper than
    Python's recursion limit allows."""
    stack: list[tuple[JsonPath, object, object]] = [((), reference, candidate)]
    while stack:
        path, ref, cand = stack.pop()
        children: list[tuple[JsonPath, object, object]] = []
        if isinstance(ref, dict) and isinstance(cand, dict):
            for key in ref:
                children.append(((*path, _key(key)), ref[key], cand.get(key, _MISSING)))
            for key in cand:
                if key not in ref:
                    children.append(((*path, _key(key)), _MISSING, cand[key]))
        elif isinstance(ref, list | tuple) and isinstance(cand, list | tuple):
            for i in range(max(len(ref), len(cand))):
                children.append(((*path, i), ref[i] if i < len(ref) else _MISSING,
                                 cand[i] if i < len(cand) else _MISSING))
        else:
            yield path, ref, cand
            continue
        stack.extend(reversed(children))


def _json_leaf_close(
    ref: object, cand: object, *, rtol: float, atol: float,
) -> tuple[bool, float | None, float | None]:
    """(matches, absolute error, relative error); errors only for two finite numbers."""
    if _is_json_number(ref) and _is_json_number(cand):
        r, c = cast(float, ref), cast(float, cand)
        if r == c:
            return True, 0.0, 0.0
        try:
            rf, cf = float(r), float(c)
        except OverflowError:  # integers beyond float range: only equality is meaningful
            return False, None, None
        if math.isnan(rf) or math.isnan(cf):
            return math.isnan(rf) and math.isnan(cf), None, None
        if math.isinf(rf) or math.isinf(cf):
            return False, None, None
        diff = abs(cf - rf)
        return diff <= atol + rtol * abs(rf), diff, diff / abs(rf) if rf else None
    return _json_type(ref) == _json_type(cand) and ref == cand, None, None


def _is_json_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_type(value: object) -> str:
    if value is _MISSING:
        return "missing"
    if isinstance(value, bool):
        return "bool"
    return "number" if _is_json_number(value) else type(value).__name__


def _json_number_pair(ref: object, cand: object) -> tuple[float, float] | None:
    if not (_is_json_number(ref) and _is_json_number(cand)):
        return None
    try:
        return float(cast(float, ref)), float(cast(float, cand))
    except OverflowError:
        return None


def _key(key: object) -> int | str:
    return key if isinstance(key, str | int) and not isinstance(key, bool) else str(key)


def _json_path(path: JsonPath) -> str:
    if not path:
        return "the root"
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _json_show(value: object) -> str:
    if value is _MISSING:
        return "(missing)"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- files --------------------------------------------------------------------------------


def _load(name: str, *, dir_fd: int | None, label: str, max_bytes: int) -> object:
    """Open ``name`` (relative to ``dir_fd`` when given) without following a symlink and without
    blocking on a FIFO, check it is a regular file within ``max_bytes``, and parse it."""
    if name.endswith(".npy"):
        kind = "npy"
    elif name.endswith(".json"):
        kind = "json"
    else:
        raise ValueError(f"{label}: not an output file (expected .npy or .json)")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ValueError(f"{label} is a symlink; outputs must be plain files") from error
        raise ValueError(f"{label} cannot be opened: {error.strerror}") from error
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{label} is not a regular file")
        if info.st_size > max_bytes:
            raise ValueError(f"{label} is {info.st_size} bytes, over the limit of {max_bytes}")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as file:
        if kind == "npy":
            return _read_npy(file, label, info.st_size)
        return _read_json(file, label, max_bytes)


def _read_npy(file: IO[bytes], label: str, file_size: int) -> npt.NDArray[Any]:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(file)
        # Version 3.0 differs from 2.0 only in the header's encoding (UTF-8 for field names);
        # read as Latin-1 its shape and item size are the same.
        reader = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _fortran_order, dtype = reader(file)
    except (ValueError, SyntaxError, TypeError, OSError, EOFError) as error:
        raise ValueError(f"{label} is not a readable .npy file: {error}") from error
    if dtype.hasobject:
        raise ValueError(f"{label} holds Python objects (dtype {dtype}); "
                         f"pickled arrays are refused")
    promised = math.prod(shape) * dtype.itemsize
    held = file_size - file.tell()
    if promised > held:
        raise ValueError(f"{label}: its header promises {promised} bytes of data "
                         f"but the file holds {held}")
    file.seek(0)
    try:
        return np.lib.format.read_array(file, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise ValueError(f"{label} is not a readable .npy file: {error}") from error


def _read_json(file: IO[bytes], label: str, max_bytes: int) -> object:
    data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{label} is over the limit of {max_bytes} bytes")
    try:
        return cast(object, json.loads(data.decode("utf-8")))
    except (ValueError, RecursionError) as error:
        raise ValueError(f"{label} is not valid JSON: {error}") from error


class _Folder:
    """One side's outputs folder, opened once without following a symlink; its files are
    opened relative to it, so a swapped path component cannot redirect them."""

    def __init__(self, path: Path, role: str) -> None:
        self.role, self.path = role, path
        self.fd: int | None = None
        self.outputs: dict[str, list[str]] = {}
        self.metas: dict[str, str] = {}
        try:
            info = path.lstat()
        except FileNotFoundError:
            return
        if stat.S_ISLNK(info.st_mode):
            raise ValueError(f"the {role} outputs folder {path} is a symlink; refused")
        if not stat.S_ISDIR(info.st_mode):
            raise ValueError(f"the {role} outputs folder {path} is not a folder")
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            with os.scandir(self.fd) as entries:
                for entry in entries:
                    self._add(entry.name)
        except OSError:
            self.close()
            raise
        for names in self.outputs.values():
            names.sort()

    def _add(self, name: str) -> None:
        if name.endswith(META_SUFFIX):
            if case := name[: -len(META_SUFFIX)]:
                self.metas[case] = name
        elif name.endswith(OUTPUT_SUFFIXES) and (case := name.rsplit(".", 1)[0]):
            self.outputs.setdefault(case, []).append(name)

    def load(self, case: str, max_bytes: int) -> object:
        names = self.outputs[case]
        if len(names) > 1:
            raise ValueError(f"two outputs for one case: {' and '.join(names)}")
        return _load(names[0], dir_fd=self.fd, label=names[0], max_bytes=max_bytes)

    def meta_size(self, case: str) -> float | None:
        name = self.metas.get(case)
        if name is None:
            return None
        try:
            meta = _load(name, dir_fd=self.fd, label=name, max_bytes=META_MAX_BYTES)
        except ValueError:
            return None
        return _json_size(meta)

    def only_json(self, case: str) -> bool:
        return self.outputs.get(case) == [f"{case}.json"]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> _Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _compare_case(
    case: str, ref: _Folder, cand: _Folder, *, rtol: float, atol: float, given: float | None,
    max_bytes: int,
) -> CaseComparison:
    paired = case in ref.outputs and case in cand.outputs
    outputs: dict[str, object] = {}
    errors: dict[str, str] = {}
    for side in (ref, cand):
        # A lone output is read only when it is JSON: only then can it carry the size.
        if case in side.outputs and (paired or side.only_json(case)):
            try:
                outputs[side.role] = side.load(case, max_bytes)
            except ValueError as error:
                errors[side.role] = str(error)
    size = _first_size(
        lambda: ref.meta_size(case), lambda: cand.meta_size(case),
        lambda: _json_size(outputs.get("reference")),
        lambda: _json_size(outputs.get("candidate")), lambda: given,
    )

    def missing(status: str, side: str) -> CaseComparison:
        return _unpaired(case, status, size,
                         f"the {side} wrote no output ({case}.npy or {case}.json)")

    if case not in ref.outputs:
        return missing("missing-reference", "reference")
    if case not in cand.outputs:
        return missing("missing-candidate", "candidate")
    if errors:
        role, reason = next(iter(errors.items()))  # the reference's first
        return _unpaired(case, "unreadable", size, f"the {role} output: {reason}")
    reference, candidate = outputs["reference"], outputs["candidate"]
    ref_array, cand_array = isinstance(reference, np.ndarray), isinstance(candidate, np.ndarray)
    if ref_array and cand_array:
        return compare_arrays(case, cast(npt.NDArray[Any], reference),
                              cast(npt.NDArray[Any], candidate), rtol=rtol, atol=atol, size=size)
    if not ref_array and not cand_array:
        return compare_json(case, reference, candidate, rtol=rtol, atol=atol, size=size)
    what = {True: "an array (.npy)", False: "JSON (.json)"}
    return _unpaired(case, "dtype-mismatch", size,
                     f"the reference is {what[ref_array]}, the candidate {what[cand_array]}")


def _unpaired(case: str, status: str, size: float | None, detail: str) -> CaseComparison:
    return CaseComparison(
        case=case, status=status, shape=None, dtype=None, max_abs_error=None,
        max_rel_error=None, max_ulp=None, mismatches=0, first_mismatch=None,
        first_values=None, size=size, detail=f"case {case}: {detail}",
    )


# --- series and helpers -------------------------------------------------------------------


def _log_log_slope(points: Sequence[tuple[float, float]]) -> float | None:
    usable = [(math.log(s), math.log(e)) for s, e in points if s > 0 and e > 0]
    if len(usable) < 2:
        return None
    x = np.array([p[0] for p in usable])
    y = np.array([p[1] for p in usable])
    x_centred = x - x.mean()
    return float(np.dot(x_centred, y - y.mean()) / np.dot(x_centred, x_centred))


def _spearman(points: Sequence[tuple[float, float]]) -> float | None:
    """Rank correlation of size and error, ties given their average rank; ``None`` when either
    is constant."""
    if len(points) < 2:
        return None
    sizes = _ranks([s for s, _ in points])
    errors = _ranks([e for _, e in points])
    if np.std(sizes) == 0 or np.std(errors) == 0:
        return None
    return float(np.corrcoef(sizes, errors)[0, 1])


def _ranks(values: Sequence[float]) -> npt.NDArray[np.float64]:
    array = np.asarray(values, dtype=np.float64)
    ranks = np.empty(len(array), dtype=np.float64)
    ranks[np.argsort(array, kind="stable")] = np.arange(len(array), dtype=np.float64)
    for value in np.unique(array):
        tied = array == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def _check_tolerances(rtol: float, atol: float) -> None:
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0; got {value!r}")


def _max(current: _N | None, new: _N | None) -> _N | None:
    if new is None:
        return current
    return new if current is None or new > current else current


_DECIMAL_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _finite_number(value: object) -> float | None:
    """A finite int or float (numpy's too) as a float; None for anything else, booleans and
    integers beyond float range included."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range
        return None
    return number if math.isfinite(number) else None


def _json_size(value: object) -> float | None:
    """The size in a meta file or a JSON output: a finite number at the key "size" of an
    object."""
    return _finite_number(value.get("size")) if isinstance(value, dict) else None


def _label_size(value: object) -> float | None:
    """A size label: a finite number, or a string spelling one in decimal."""
    if isinstance(value, str):
        text = value.strip()
        return _finite_number(float(text)) if _DECIMAL_RE.fullmatch(text) else None
    return _finite_number(value)


def _first_size(*sources: Callable[[], float | None]) -> float | None:
    """The first size a source yields; the later sources (files to read) are not consulted."""
    for source in sources:
        size = source()
        if size is not None:
            return size
    return None


def _float_or_none(value: float | None) -> float | None:
    return None if value is None else float(value)


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _size(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.6g}"


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sorts names as people count: len-64 before len-256."""
    return tuple((0, int(part)) if part.isdigit() else (1, part)
                 for part in re.split(r"(\d+)", name) if part)


def _plain(value: object) -> object:
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
