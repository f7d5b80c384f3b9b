"""infraops.feedback.correctness: per-case output comparisons, output files, error-versus-size
series."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infraops.feedback.correctness import (
    CaseComparison,
    compare_arrays,
    compare_json,
    compare_output_dirs,
    error_series,
    load_output,
    sizes_from_labels,
)

F32, F64 = np.float32, np.float64
NAN, INF = float("nan"), float("inf")


def with_value(array: np.ndarray, index: tuple[int, ...], value: float) -> np.ndarray:
    changed = array.copy()
    changed[index] = value
    return changed


BASE = np.linspace(0.25, 1.0, 4096, dtype=F32)
GRID = np.arange(12, dtype=F64).reshape(3, 4)


@pytest.mark.parametrize(
    ("reference", "candidate", "status", "mismatches", "first", "values"),
    [
        pytest.param(BASE, BASE.copy(), "match", 0, None, None, id="exact-match"),
        pytest.param(BASE, with_value(BASE, (4031,), 0.5030), "mismatch", 1, (4031,),
                     (float(BASE[4031]), float(F32(0.503))), id="one-element-off"),
        pytest.param(BASE, BASE * F32(1 + 2e-6), "match", 0, None, None,
                     id="within-rtol"),
        pytest.param(BASE, with_value(with_value(BASE, (7,), 9.0), (4000,), 9.0), "mismatch", 2,
                     (7,), (float(BASE[7]), 9.0), id="first-of-two-in-c-order"),
        pytest.param(GRID, with_value(GRID, (2, 1), 0.0), "mismatch", 1, (2, 1), (9.0, 0.0),
                     id="multi-index"),
        pytest.param(np.array([1.0, NAN, 3.0]), np.array([1.0, NAN, 3.0]), "match", 0, None,
                     None, id="nan-at-the-same-place"),
        pytest.param(np.array([1.0, NAN, 3.0]), np.array([1.0, 2.0, 3.0]), "mismatch", 1, (1,),
                     None, id="nan-vs-number"),
        pytest.param(np.array([1.0, 2.0]), np.array([1.0, NAN]), "mismatch", 1, (1,), None,
                     id="number-vs-nan"),
        pytest.param(np.array([INF, -INF]), np.array([INF, -INF]), "match", 0, None, None,
                     id="same-infinities"),
        pytest.param(np.array([INF, 1.0]), np.array([-INF, 1.0]), "mismatch", 1, (0,),
                     (INF, -INF), id="opposite-infinities"),
        pytest.param(np.array([0.0]), np.array([-0.0]), "match", 0, None, None,
                     id="plus-and-minus-zero"),
        pytest.param(np.arange(10, dtype=np.int64), np.arange(10, dtype=np.int64), "match", 0,
                     None, None, id="integers-equal"),
        pytest.param(np.arange(10, dtype=np.int32), with_value(np.arange(10, dtype=np.int32),
                     (6,), 7), "mismatch", 1, (6,), (6.0, 7.0), id="integers-differ"),
        pytest.param(np.array(["a", "b"]), np.array(["a", "c"]), "mismatch", 1, (1,), None,
                     id="strings-compared-exactly"),
        pytest.param(np.zeros((0, 3)), np.zeros((0, 3)), "match", 0, None, None,
                     id="empty"),
    ],
)
def test_compare_arrays_finds_the_first_element_outside_tolerance(
    reference: np.ndarray, candidate: np.ndarray, status: str, mismatches: int,
    first: tuple[int, ...] | None, values: tuple[float, float] | None,
) -> None:
    result = compare_arrays("17", reference, candidate, rtol=1e-5, atol=1e-8)

    assert (result.status, result.mismatches, result.first_mismatch) == (
        status, mismatches, first)
    if values is not None:
        assert result.first_values == values
    assert result.shape == reference.shape and result.dtype == str(reference.dtype)
    assert result.detail.startswith("case 17: ")


def test_arrays_larger_than_one_scan_step_are_tallied_across_steps() -> None:
    reference = np.ones((3, 250_000), dtype=F32)
    candidate = with_value(with_value(reference, (1, 10), 2.0), (2, 7), 4.0)

    result = compare_arrays("big", reference, candidate, rtol=1e-5, atol=1e-8)

    assert (result.mismatches, result.first_mismatch, result.first_values) == (2, (1, 10),
                                                                                (1.0, 2.0))
    assert (result.max_abs_error, result.max_ulp) == (3.0, 0x40800000 - 0x3F800000)


def test_integers_are_compared_exactly_beyond_float64_precision() -> None:
    result = compare_arrays("i", np.array([2**60, 5], dtype=np.int64),
                            np.array([2**60 + 1, 5], dtype=np.int64), rtol=0, atol=0)

    assert (result.status, result.first_mismatch, result.max_abs_error) == ("mismatch", (0,), 1)
    assert "first at [0]: 1152921504606846976 vs 1152921504606846977 (abs 1)" in result.detail


def test_a_mismatch_is_reported_locally_case_index_values_and_distance() -> None:
    candidate = with_value(BASE, (4031,), 0.503)
    result = compare_arrays("17", BASE, candidate, rtol=1e-5, atol=1e-8, size=4096)

    expected_abs = abs(float(F32(0.503)) - float(BASE[4031]))
    assert result.max_abs_error == pytest.approx(expected_abs)
    assert result.max_rel_error == pytest.approx(expected_abs / float(BASE[4031]))
    assert result.max_ulp is not None and result.max_ulp > 1000
    assert result.size == 4096
    assert result.detail.startswith(
        f"case 17: 1 of 4096 elements differ; first at [4031]: {BASE[4031]!s} vs 0.503 (abs ")
    assert f"{result.max_ulp} ULP" in result.detail


def test_within_tolerance_the_detail_still_gives_the_largest_error() -> None:
    result = compare_arrays("7", BASE, BASE * F32(1 + 2e-6), rtol=1e-5, atol=0.0)

    assert result.status == "match" and result.max_ulp is not None and result.max_ulp >= 1
    assert result.max_rel_error is not None and 1e-6 < result.max_rel_error < 1e-5
    assert "all 4096 elements match within rtol 1e-05" in result.detail


def test_atol_alone_decides_where_the_reference_is_zero() -> None:
    reference, candidate = np.array([0.0, 0.0]), np.array([5e-9, 2e-8])

    result = compare_arrays("z", reference, candidate, rtol=1e-5, atol=1e-8)

    assert (result.mismatches, result.first_mismatch) == (1, (1,))
    assert result.max_abs_error == pytest.approx(2e-8)
    assert result.max_rel_error is None  # no non-zero reference to be relative to


def next_up(value: float, dtype: type[np.floating[Any]]) -> np.floating[Any]:
    return np.nextafter(dtype(value), dtype(np.inf))


@pytest.mark.parametrize(
    ("dtype", "reference", "candidate", "ulp"),
    [
        pytest.param(F32, 1.0, next_up(1.0, F32), 1, id="f32-adjacent"),
        pytest.param(F64, 1.0, next_up(1.0, F64), 1, id="f64-adjacent"),
        pytest.param(np.float16, 1.0, next_up(1.0, np.float16), 1, id="f16-adjacent"),
        pytest.param(F32, 1.0, F32(1.0) + 3 * np.spacing(F32(1.0)), 3, id="f32-three-apart"),
        pytest.param(F32, 0.0, -0.0, 0, id="f32-plus-minus-zero"),
        pytest.param(F64, -0.0, 0.0, 0, id="f64-minus-plus-zero"),
        pytest.param(F32, np.finfo(F32).smallest_subnormal, -np.finfo(F32).smallest_subnormal,
                     2, id="f32-across-zero-subnormals"),
        pytest.param(F64, -np.finfo(F64).smallest_subnormal, 0.0, 1, id="f64-subnormal-to-zero"),
        pytest.param(F32, 1.0, -1.0, 2 * 0x3F800000, id="f32-one-to-minus-one"),
        pytest.param(F64, 1.0, -1.0, 2 * 0x3FF0000000000000, id="f64-one-to-minus-one"),
        pytest.param(F64, -np.finfo(F64).max, np.finfo(F64).max, 2 * 0x7FEFFFFFFFFFFFFF,
                     id="f64-widest-finite-span-beyond-int64"),
        pytest.param(F32, np.finfo(F32).max, np.inf, 1, id="f32-max-to-inf"),
        pytest.param(F64, -2.0, next_up(-2.0, F64), 1, id="f64-adjacent-negative"),
        pytest.param(F32, NAN, NAN, 0, id="nan-vs-nan"),
    ],
)
def test_ulp_distance_counts_representable_floats_between(
    dtype: type[np.floating[Any]], reference: float, candidate: float, ulp: int,
) -> None:
    result = compare_arrays("u", np.array([reference], dtype=dtype),
                            np.array([candidate], dtype=dtype), rtol=0.0, atol=0.0)

    assert result.max_ulp == ulp
    assert result.status == ("match" if ulp == 0 else "mismatch")


def test_ulp_distance_leaves_out_nan_against_a_number() -> None:
    result = compare_arrays("u", np.array([1.0, NAN], dtype=F32),
                            np.array([next_up(1.0, F32), 1.0], dtype=F32), rtol=0.0, atol=0.0)

    assert (result.max_ulp, result.mismatches, result.first_mismatch) == (1, 2, (0,))


def test_ulp_distance_is_for_floats_of_one_dtype_only() -> None:
    assert compare_arrays("i", np.arange(3), np.arange(3), rtol=0, atol=0).max_ulp is None
    mixed = compare_arrays("m", np.ones(3, dtype=F32), np.ones(3, dtype=F64), rtol=0, atol=0)
    assert mixed.max_ulp is None


def test_byte_order_is_not_a_dtype_difference() -> None:
    big = np.array([1.0, 2.0], dtype=">f8")

    result = compare_arrays("b", big, np.array([1.0, next_up(2.0, F64)]), rtol=0, atol=0)

    assert (result.status, result.max_ulp, result.dtype) == ("mismatch", 1, "float64")


@pytest.mark.parametrize(
    ("reference", "candidate", "status", "named"),
    [
        pytest.param(np.zeros((4, 4), F32), np.zeros((4, 5), F32), "shape-mismatch",
                     ["shape differs", "(4, 4)", "(4, 5)"], id="shape"),
        pytest.param(np.zeros(4, F32), np.zeros((2, 2), F32), "shape-mismatch",
                     ["(4,)", "(2, 2)"], id="same-size-other-shape"),
        pytest.param(np.ones(4, F64), np.ones(4, F32), "dtype-mismatch",
                     ["dtype differs", "float64", "float32", "all 4 elements equal"],
                     id="dtype-values-equal"),
        pytest.param(np.full(4, 0.1, F64), np.full(4, 0.1, F32), "dtype-mismatch",
                     ["float64", "float32", "all 4 elements match within rtol 1e-05"],
                     id="dtype-values-within-tolerance"),
        pytest.param(np.ones(4, F32), np.array(["1"] * 4), "dtype-mismatch",
                     ["float32", "<U1", "not compared"], id="dtype-not-comparable"),
    ],
)
def test_shape_and_dtype_differences_are_named(
    reference: np.ndarray, candidate: np.ndarray, status: str, named: list[str],
) -> None:
    result = compare_arrays("9", reference, candidate, rtol=1e-5, atol=1e-8)

    assert result.status == status
    assert result.detail.startswith("case 9: ")
    for text in named:
        assert text in result.detail


def test_a_dtype_mismatch_still_measures_how_far_apart_the_values_are() -> None:
    result = compare_arrays("d", np.full(3, 0.1, F64), np.full(3, 0.1, F32), rtol=0, atol=0)

    assert result.max_abs_error == pytest.approx(abs(float(F32(0.1)) - 0.1))
    assert result.mismatches == 3 and result.first_mismatch == (0,)


@pytest.mark.parametrize("tolerances", [{"rtol": -1.0, "atol": 0.0}, {"rtol": 0.0, "atol": NAN}])
def test_it_refuses_a_tolerance_that_means_nothing(tolerances: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        compare_arrays("t", np.ones(2), np.ones(2), **tolerances)


@pytest.mark.parametrize(
    ("reference", "candidate", "status", "first", "values", "detail"),
    [
        pytest.param({"tokens": [1, 2, 3], "text": "ok"}, {"tokens": [1, 2, 3], "text": "ok"},
                     "match", None, None, "all 4 JSON values match", id="equal"),
        pytest.param({"logits": [0.5, 1.0]}, {"logits": [0.5000001, 1.0]}, "match", None,
                     None, "match", id="number-within-tolerance"),
        pytest.param({"tokens": [5, 6, 7, 8, 9]}, {"tokens": [5, 6, 7, 4, 1]}, "mismatch",
                     ("tokens", 3), (8.0, 4.0), "2 of 5 JSON values differ; first at tokens[3]",
                     id="first-differing-path"),
        pytest.param({"a": {"b": [{"c": "x"}]}}, {"a": {"b": [{"c": "y"}]}}, "mismatch",
                     ("a", "b", 0, "c"), None, 'a.b[0].c: "x" vs "y"', id="nested-string"),
        pytest.param({"a": 1, "b": 2}, {"a": 1}, "mismatch", ("b",), None,
                     "b: 2 vs (missing)", id="missing-key"),
        pytest.param({"a": 1}, {"a": 1, "z": 0}, "mismatch", ("z",), None,
                     "z: (missing) vs 0", id="extra-key"),
        pytest.param([1, 2], [1, 2, 3], "mismatch", (2,), None, "[2]: (missing) vs 3",
                     id="longer-list"),
        pytest.param({"flag": True}, {"flag": 1}, "mismatch", ("flag",), None,
                     "flag: true vs 1", id="bool-is-not-a-number"),
        pytest.param({"x": 1}, {"x": 1.0}, "match", None, None, "match",
                     id="int-and-float-are-numbers"),
        pytest.param({"x": None}, {"x": [None]}, "mismatch", ("x",), None,
                     "x: null vs [null]", id="type-differs"),
        pytest.param({"x": NAN}, {"x": NAN}, "match", None, None, "match", id="nan-and-nan"),
        pytest.param(3, 4, "mismatch", (), (3.0, 4.0), "first at the root", id="bare-number"),
    ],
)
def test_compare_json_walks_both_values_in_document_order(
    reference: object, candidate: object, status: str, first: tuple[int | str, ...] | None,
    values: tuple[float, float] | None, detail: str,
) -> None:
    result = compare_json("c", reference, candidate, rtol=1e-5, atol=1e-8)

    assert (result.status, result.first_mismatch, result.first_values) == (
        status, first, values)
    assert result.dtype == "json" and result.shape is None
    assert detail in result.detail


def test_compare_json_survives_nesting_deeper_than_the_recursion_limit() -> None:
    reference: object = 1
    candidate: object = 2
    for _ in range(5000):
        reference, candidate = [reference], [candidate]

    result = compare_json("deep", reference, candidate, rtol=0, atol=0)

    assert result.first_mismatch == (0,) * 5000


def test_as_dict_is_strict_json_even_with_nan_and_infinity() -> None:
    result = compare_arrays("n", np.array([INF, 1.0]), np.array([NAN, 1.0]), rtol=0, atol=0)

    plain = result.as_dict()

    assert plain["first_values"] == ["inf", "nan"]
    assert plain["first_mismatch"] == [0]
    assert json.loads(json.dumps(plain, allow_nan=False)) == plain


# --- files --------------------------------------------------------------------------------


def test_load_output_reads_arrays_and_json(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", GRID)
    (tmp_path / "b.json").write_text('{"tokens": [1, 2]}')

    array = load_output(tmp_path / "a.npy", max_bytes=1 << 20)

    assert isinstance(array, np.ndarray) and np.array_equal(array, GRID)
    assert load_output(tmp_path / "b.json", max_bytes=1 << 20) == {"tokens": [1, 2]}


def write_pickled(path: Path) -> None:
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)


def write_truncated(path: Path) -> None:
    np.save(path, np.zeros(1000, F64))
    path.write_bytes(path.read_bytes()[:400])


def write_symlink(path: Path) -> None:
    target = path.parent / "elsewhere" / path.name
    target.parent.mkdir()
    np.save(target, GRID)
    path.symlink_to(target)


@pytest.mark.parametrize(
    ("name", "write", "message"),
    [
        pytest.param("o.npy", write_pickled, "pickled arrays are refused", id="pickle"),
        pytest.param("t.npy", write_truncated, "promises 8000 bytes", id="truncated"),
        pytest.param("s.npy", write_symlink, "is a symlink", id="symlink"),
        pytest.param("f.npy", lambda p: os.mkfifo(p), "not a regular file", id="fifo"),
        pytest.param("d.npy", lambda p: p.mkdir(), "not a regular file", id="folder"),
        pytest.param("big.json", lambda p: p.write_text("[" + "0," * 600 + "0]"),
                     "over the limit of 1024", id="oversize"),
        pytest.param("bad.json", lambda p: p.write_text("{tokens"), "not valid JSON",
                     id="bad-json"),
        pytest.param("junk.npy", lambda p: p.write_bytes(b"PK\x03\x04 zip"),
                     "not a readable .npy file", id="not-npy"),
        pytest.param("x.npz", lambda p: np.savez(p, a=GRID), "expected .npy or .json",
                     id="npz"),
        pytest.param("x.pkl", lambda p: p.write_bytes(b"\x80\x04."), "expected .npy or .json",
                     id="pickle-file"),
    ],
)
def test_load_output_refuses_what_a_probe_should_not_write(
    tmp_path: Path, name: str, write: Any, message: str,
) -> None:
    path = tmp_path / name
    write(path)

    with pytest.raises(ValueError, match=message):
        load_output(path, max_bytes=1024 if "json" in name else 1 << 20)


def test_deeply_nested_json_within_the_size_limit_is_refused_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)

    with pytest.raises(ValueError, match="not valid JSON"):
        load_output(path, max_bytes=1 << 20)


def write_outputs(folder: Path, outputs: dict[str, Any],
                  sizes: Mapping[str, float] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for case, value in outputs.items():
        if isinstance(value, np.ndarray):
            np.save(folder / f"{case}.npy", value)
        else:
            (folder / f"{case}.json").write_text(json.dumps(value))
    for case, size in (sizes or {}).items():
        (folder / f"{case}.meta.json").write_text(json.dumps({"size": size}))
    return folder


def by_case(comparisons: list[CaseComparison]) -> dict[str, CaseComparison]:
    return {c.case: c for c in comparisons}


def test_compare_output_dirs_pairs_cases_by_name(tmp_path: Path) -> None:
    ref = write_outputs(tmp_path / "off", {
        "case10": GRID, "case2": GRID, "tokens": {"ids": [1, 2, 3]}, "gone": GRID,
        "mixed": GRID,
    }, sizes={"case2": 256})
    cand = write_outputs(tmp_path / "on", {
        "case10": with_value(GRID, (1, 3), 99.0), "case2": GRID, "tokens": {"ids": [1, 2, 4]},
        "new": GRID, "mixed": {"a": 1},
    }, sizes={"case10": 1024})
    (cand / "notes.txt").write_text("not an output")

    results = compare_output_dirs(ref, cand, rtol=1e-5, atol=1e-8)

    assert [c.case for c in results] == ["case2", "case10", "gone", "mixed", "new", "tokens"]
    found = by_case(results)
    assert (found["case2"].status, found["case2"].size) == ("match", 256.0)
    assert found["case10"].status == "mismatch"
    assert (found["case10"].first_mismatch, found["case10"].size) == ((1, 3), 1024.0)
    assert found["case10"].detail.startswith("case case10: 1 of 12 elements differ; first at "
                                             "[1, 3]: 7.0 vs 99.0")
    assert found["tokens"].first_mismatch == ("ids", 2)
    assert found["gone"].status == "missing-candidate" and "candidate" in found["gone"].detail
    assert found["new"].status == "missing-reference" and "reference" in found["new"].detail
    assert found["mixed"].status == "dtype-mismatch" and "JSON" in found["mixed"].detail


def test_meta_files_win_over_sizes_passed_in(tmp_path: Path) -> None:
    ref = write_outputs(tmp_path / "r", {"a": GRID, "b": GRID}, sizes={"a": 1})
    cand = write_outputs(tmp_path / "c", {"a": GRID, "b": GRID}, sizes={"a": 3})
    (cand / "c.meta.json").write_text('{"size": 5}')  # meta without an output: no case

    results = by_case(compare_output_dirs(ref, cand, rtol=0, atol=0,
                                          sizes={"a": 32.0, "b": 64.0, "c": 5.0}))

    assert set(results) == {"a", "b"}
    assert (results["a"].size, results["b"].size) == (1.0, 64.0)


def obj(size: object, **rest: object) -> dict[str, object]:
    return {"size": size, **rest}


HUGE = 10**400  # a JSON integer beyond float range


# (reference output, reference meta, candidate output, candidate meta, sizes, status, size);
# None for an output: that side wrote none; None for a meta: no meta file.
SIZE_CASES = [
    pytest.param(obj(3), '{"size": 1}', obj(4), '{"size": 2}', {"a": 5}, "mismatch", 1.0,
                 id="reference-meta-first"),
    pytest.param(obj(3), None, obj(4), '{"size": 2}', {"a": 5}, "mismatch", 2.0,
                 id="then-candidate-meta"),
    pytest.param(obj(3), None, obj(4), None, {"a": 5}, "mismatch", 3.0,
                 id="then-reference-json-field"),
    pytest.param({"logits": [1]}, None, obj(4, logits=[1]), None, {"a": 5}, "mismatch", 4.0,
                 id="then-candidate-json-field"),
    pytest.param(obj(8, x=[1.0]), None, obj(8, x=[1.0]), None, {"a": 5}, "match", 8.0,
                 id="json-field-agreeing"),
    pytest.param([1, 2], None, [1, 2], None, {"a": 5}, "match", 5.0,
                 id="then-sizes-for-a-json-array"),
    pytest.param(GRID, None, GRID, None, {"a": 5}, "match", 5.0, id="then-sizes-for-npy"),
    pytest.param(GRID, None, GRID, None, {"b": 5}, "match", None, id="nothing-sizes-it"),
    pytest.param(obj(3), "{", obj(4), None, None, "mismatch", 3.0,
                 id="malformed-meta-passed-over"),
    pytest.param(obj(3), f'{{"size": {HUGE}}}', obj(3), None, None, "match", 3.0,
                 id="meta-beyond-float-range-passed-over"),
    pytest.param(obj("4096"), None, obj("4096"), None, {"a": 5}, "match", 5.0,
                 id="json-text-size-passed-over"),
    pytest.param(obj(True), None, obj(True), None, None, "match", None,
                 id="json-boolean-size-passed-over"),
    pytest.param(obj(NAN), None, obj(16), None, None, "mismatch", 16.0,
                 id="json-nan-size-passed-over"),
    pytest.param(obj(HUGE), None, obj(HUGE), None, {"a": 5}, "match", 5.0,
                 id="json-size-beyond-float-range-passed-over"),
    pytest.param(obj(3), None, None, None, {"a": 5}, "missing-candidate", 3.0,
                 id="lone-reference-json"),
    pytest.param(None, None, obj(4), None, {"a": 5}, "missing-reference", 4.0,
                 id="lone-candidate-json"),
    pytest.param(GRID, None, obj(4), None, None, "dtype-mismatch", 4.0,
                 id="npy-against-json"),
    pytest.param(obj(3), None, obj(4), None, {"a": NAN}, "mismatch", 3.0,
                 id="json-field-before-a-nan-in-sizes"),
    pytest.param(GRID, None, GRID, None, {"a": NAN}, "match", None, id="nan-in-sizes-ignored"),
    pytest.param(GRID, None, GRID, None, {"a": np.int64(7)}, "match", 7.0,
                 id="numpy-number-in-sizes"),
]


@pytest.mark.parametrize(
    ("ref_output", "ref_meta", "cand_output", "cand_meta", "sizes", "status", "size"),
    SIZE_CASES,
)
def test_a_case_size_comes_from_meta_then_json_field_then_sizes(
    tmp_path: Path, ref_output: object, ref_meta: str | None, cand_output: object,
    cand_meta: str | None, sizes: Mapping[str, float] | None, status: str, size: float | None,
) -> None:
    folders = []
    for name, output, meta in (("r", ref_output, ref_meta), ("c", cand_output, cand_meta)):
        folder = write_outputs(tmp_path / name, {} if output is None else {"a": output})
        if meta is not None:
            (folder / "a.meta.json").write_text(meta)
        folders.append(folder)

    (result,) = compare_output_dirs(*folders, rtol=0, atol=0, sizes=sizes)

    assert (result.status, result.size) == (status, size)


def test_an_unreadable_side_still_lets_the_other_json_size_the_case(tmp_path: Path) -> None:
    ref = write_outputs(tmp_path / "r", {"a": {"size": 3, "x": list(range(100))}})
    cand = write_outputs(tmp_path / "c", {"a": {"size": 4, "x": list(range(4000))}})

    (result,) = compare_output_dirs(ref, cand, rtol=0, atol=0, max_bytes=4096)

    assert (result.status, result.size) == ("unreadable", 3.0)
    assert "the candidate output" in result.detail


def test_sizes_from_labels_feed_the_error_series(tmp_path: Path) -> None:
    ref: dict[str, Any] = {}
    cand: dict[str, Any] = {}
    rows: list[tuple[str, Mapping[str, Any]]] = []
    for i, size in enumerate(SIZES):
        ref[f"c{i}"] = np.array([1.0])
        cand[f"c{i}"] = np.array([1.0 + 1e-6 * size])
        rows += [(f"c{i}", {"size": size}), (f"c{i}", {"size": str(size), "repeat": 1})]

    comparisons = compare_output_dirs(write_outputs(tmp_path / "r", ref),
                                      write_outputs(tmp_path / "c", cand), rtol=0, atol=0,
                                      sizes=sizes_from_labels(rows))

    series = error_series(comparisons)
    assert [size for size, _ in series.points] == SIZES
    assert series.growing


@pytest.mark.parametrize(("rows", "expected"), [
    pytest.param([], {}, id="no-rows"),
    pytest.param([("a", {"size": 4096})], {"a": 4096.0}, id="number"),
    pytest.param([("a", {"size": 0.5}), ("b", {"size": -2})], {"a": 0.5, "b": -2.0},
                 id="float-and-negative"),
    pytest.param([("a", {"size": "4096"}), ("b", {"size": " 1.5e3 "}), ("c", {"size": "+.5"})],
                 {"a": 4096.0, "b": 1500.0, "c": 0.5}, id="numeric-strings"),
    pytest.param([("a", {"size": np.int64(8)}), ("b", {"size": np.float32(0.5)})],
                 {"a": 8.0, "b": 0.5}, id="numpy-numbers"),
    pytest.param([("a", {"size": 4096}), ("a", {"size": "4096.0"}), ("a", {"size": 4096})],
                 {"a": 4096.0}, id="repeats-agreeing"),
    pytest.param([("a", {"size": 1}), ("a", {"size": 2})], {}, id="conflict-dropped"),
    pytest.param([("a", {"size": 1}), ("a", {"size": 2}), ("a", {"size": 1})], {},
                 id="conflict-stays-dropped"),
    pytest.param([("a", {"size": 1}), ("b", {"size": 3}), ("a", {"size": 2})], {"b": 3.0},
                 id="conflict-touches-only-its-case"),
    pytest.param([("a", {"size": "big"}), ("a", {"size": 8}), ("a", {})], {"a": 8.0},
                 id="unusable-and-missing-do-not-conflict"),
    pytest.param([("a", {"size": value}) for value in (
        True, None, NAN, INF, "nan", "inf", "1e999", "0x10", "1_000", "", "4096 tokens", [1],
        {"n": 1}, HUGE, 1 + 2j)], {}, id="unusable-values"),
    pytest.param([("", {"size": 1})], {}, id="no-case"),
    pytest.param([("a", {"dtype": "f32"})], {}, id="no-size-label"),
    pytest.param([("a", [("size", 1)])], {}, id="labels-not-a-mapping"),
])
def test_sizes_from_labels(rows: list[tuple[str, Any]], expected: dict[str, float]) -> None:
    assert sizes_from_labels(iter(rows)) == expected


@pytest.mark.parametrize("meta", ['{"size": "4096"}', '{"size": true}', "[4096]", "{",
                                  '{"size": NaN}'])
def test_a_malformed_meta_file_gives_no_size(tmp_path: Path, meta: str) -> None:
    ref = write_outputs(tmp_path / "r", {"a": GRID})
    cand = write_outputs(tmp_path / "c", {"a": GRID})
    (ref / "a.meta.json").write_text(meta)

    (result,) = compare_output_dirs(ref, cand, rtol=0, atol=0)

    assert (result.status, result.size) == ("match", None)


@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_untrusted_files_make_their_case_unreadable(tmp_path: Path, side: str) -> None:
    ref = write_outputs(tmp_path / "reference", {"ok": GRID, "big": np.zeros(4096)})
    cand = write_outputs(tmp_path / "candidate", {"ok": GRID, "big": np.zeros(4096)})
    folder = ref if side == "reference" else cand
    secret = tmp_path / "secret.npy"
    np.save(secret, GRID)
    (folder / "linked.npy").symlink_to(secret)
    np.save((cand if side == "reference" else ref) / "linked.npy", GRID)
    np.save(folder / "twice.npy", GRID)
    (folder / "twice.json").write_text("[]")
    np.save((cand if side == "reference" else ref) / "twice.npy", GRID)

    results = by_case(compare_output_dirs(ref, cand, rtol=0, atol=0, max_bytes=8192))

    assert results["ok"].status == "match"
    for case, reason in [("linked", "is a symlink"), ("big", "over the limit of 8192"),
                         ("twice", "two outputs for one case")]:
        assert results[case].status == "unreadable"
        assert results[case].detail.startswith(f"case {case}: ")
        assert reason in results[case].detail
    assert f"the {side} output" in results["linked"].detail


def test_a_symlinked_outputs_folder_is_refused(tmp_path: Path) -> None:
    real = write_outputs(tmp_path / "real", {"a": GRID})
    (tmp_path / "link").symlink_to(real, target_is_directory=True)

    with pytest.raises(ValueError, match=r"candidate outputs folder .* is a symlink"):
        compare_output_dirs(real, tmp_path / "link", rtol=0, atol=0)


def test_a_folder_that_does_not_exist_holds_no_cases(tmp_path: Path) -> None:
    ref = write_outputs(tmp_path / "r", {"a": GRID})

    (result,) = compare_output_dirs(ref, tmp_path / "absent", rtol=0, atol=0)

    assert result.status == "missing-candidate"
    assert compare_output_dirs(tmp_path / "x", tmp_path / "y", rtol=0, atol=0) == []


# --- error versus size --------------------------------------------------------------------

SIZES = [256, 1024, 4096, 16384, 65536]
SHARD, CHUNK = 64, 16  # tokens per context-parallel shard and per chunk within it


def tf32(x: np.ndarray) -> np.ndarray:
    """Round float32 to TF32's 10-bit mantissa, to nearest (ties away), as tensor cores read
    their inputs: add half of the 13 dropped bits, then clear them."""
    bits = np.ascontiguousarray(x, dtype=F32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(F32)


def kda_cp_merge(length: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The KDA context-parallel merge: per shard, ``M = dot(M_chunk, M)`` over its chunks, then
    ``S_next = dot(M, S) + H``; in float64 (the non-parallel reference, stored as float32) and
    in float32 with TF32 dots (the candidate). Gates near 1 keep the state's memory long, so
    rounding errors are carried from shard to shard instead of decaying."""
    rng = np.random.default_rng(seed)
    shards, d = length // SHARD, 16
    chunks = rng.uniform(0.0, 1.0, (shards, SHARD // CHUNK, d, d))
    chunks *= (1 - 1e-5) / chunks.sum(axis=-1, keepdims=True)
    updates = rng.uniform(0.0, 1.0, (shards, d, d))
    s64, s32 = np.zeros((d, d)), np.zeros((d, d), F32)
    for shard_chunks, h in zip(chunks, updates, strict=True):
        m64, m32 = np.eye(d), np.eye(d, dtype=F32)
        for m_chunk in shard_chunks:
            m64 = m_chunk @ m64
            m32 = tf32(m_chunk.astype(F32)) @ tf32(m32)
        s64 = m64 @ s64 + h
        s32 = tf32(m32) @ tf32(s32) + h.astype(F32)
    return s64.astype(F32), s32


def test_error_series_exposes_a_precision_loss_that_accumulates_with_context_length(
    tmp_path: Path,
) -> None:
    ref: dict[str, Any] = {}
    cand: dict[str, Any] = {}
    for length in SIZES:
        ref[f"kda-L{length}"], cand[f"kda-L{length}"] = kda_cp_merge(length)
    sizes = {f"kda-L{length}": length for length in SIZES}
    comparisons = compare_output_dirs(write_outputs(tmp_path / "cp-off", ref, sizes),
                                      write_outputs(tmp_path / "cp-on", cand, sizes),
                                      rtol=1e-5, atol=1e-6)

    series = error_series(comparisons)

    assert [c.status for c in comparisons] == ["mismatch"] * len(SIZES)
    assert [size for size, _ in series.points] == SIZES
    assert series.points[-1][1] > 4 * series.points[0][1]
    assert series.growing and series.slope is not None and series.slope > 0.25
    assert series.detail.startswith("max relative error grows with size: ")
    assert " at 256 to " in series.detail and " at 65536 (" in series.detail


def test_error_series_of_a_kernel_whose_error_does_not_accumulate_is_flat() -> None:
    rng = np.random.default_rng(1)
    comparisons = []
    for size in SIZES:
        x = rng.uniform(-1.0, 1.0, size)
        comparisons.append(compare_arrays(f"exp-{size}", np.exp(x), np.exp(x / 2) ** 2,
                                          rtol=1e-12, atol=0.0, size=size))

    series = error_series(comparisons)

    assert len(series.points) == len(SIZES)
    assert all(0 < error < 1e-15 for _, error in series.points)
    assert not series.growing
    assert series.slope is not None and abs(series.slope) < 0.25
    assert series.detail.startswith("no evidence that max relative error grows with size")


def comparison_at(size: float | None, error: float | None) -> CaseComparison:
    return CaseComparison(
        case=f"c{size}", status="match", shape=(1,), dtype="float64", max_abs_error=error,
        max_rel_error=error, max_ulp=None, mismatches=0, first_mismatch=None,
        first_values=None, size=size, detail="",
    )


@pytest.mark.parametrize(
    ("points", "growing", "detail"),
    [
        pytest.param([(256, 0.0), (1024, 0.0), (4096, 0.0), (16384, 0.0)], False,
                     "is 0 at every size", id="identical-outputs"),
        pytest.param([(256, 1e-6), (1024, 4e-6), (4096, 1.6e-5)], False,
                     "too few sizes to judge growth (3, 4 needed)", id="too-few"),
        pytest.param([(256, 1e-6), (1024, 4e-6), (4096, 1.6e-5), (16384, 6.4e-5)], True,
                     "grows with size: 1e-06 at 256 to 6.4e-05 at 16384 (slope 1.00",
                     id="linear-growth"),
        pytest.param([(256, 1e-6), (1024, 5e-5), (4096, 2e-6), (16384, 6.4e-5)], False,
                     "no evidence", id="not-monotone"),
        pytest.param([(256, 1e-6), (1024, 1.1e-6), (4096, 1.2e-6), (16384, 1.3e-6)], False,
                     "no evidence", id="monotone-but-flat"),
        pytest.param([(256, 0.0), (1024, 0.0), (4096, 1e-7), (16384, 1e-5)], True,
                     "grows with size", id="zero-then-growing"),
        pytest.param([(None, 1e-3), (256, None)], False, "no case carries both",
                     id="nothing-to-plot"),
    ],
)
def test_error_series_needs_evidence_before_calling_growth(
    points: list[tuple[float | None, float | None]], growing: bool, detail: str,
) -> None:
    series = error_series([comparison_at(size, error) for size, error in points])

    assert series.growing is growing
    assert detail in series.detail


def test_error_series_keeps_the_worst_case_per_size_and_can_use_other_metrics() -> None:
    comparisons = [comparison_at(256, 1e-6), comparison_at(256, 3e-6), comparison_at(1024, 2e-6)]

    series = error_series(comparisons, metric="max_abs_error")

    assert series.points == ((256.0, 3e-6), (1024.0, 2e-6))
    assert series.metric == "max_abs_error" and "max absolute error" in series.detail
    assert json.dumps(series.as_dict(), allow_nan=False)
    with pytest.raises(ValueError, match="unknown metric"):
        error_series(comparisons, metric="mean_error")
    assert math.isclose(series.slope or 0.0, math.log(2 / 3) / math.log(4))
