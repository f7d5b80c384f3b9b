"""The three techniques of the cases in docs/product.md, as reviewed skeletons.

On a database where the core's migration 0013 seeded them before the library had an app of its
own, they exist and are left as they are (a person may have promoted or edited them)."""

from __future__ import annotations

from typing import Any

from django.db import migrations

SEEDS: list[dict[str, Any]] = [
    {
        "slug": "higher-precision-merge",
        "name": "Higher-precision merge: tf32x3 splitting",
        "summary": "Run an accumulating merge's FP32 dot as three TF32 products (tf32x3) "
                   "instead of one, so that its error stops growing with the number of merges.",
        "applicability": [
            {"field": "op_class", "op": "in", "value": ["merge", "scan", "matmul"]},
            {"field": "dtype", "op": "in", "value": ["fp32", "tf32"]},
            {"field": "bottleneck", "op": "eq", "value": "precision"},
        ],
        "applicability_prose":
            "A result is accumulated across many steps (the state merge of a context-parallel "
            "or chunked linear-attention kernel: M = dot(M_chunk, M); S_next = dot(M, S) + H), "
            "the inputs are FP32, and the dot runs in TF32, the default of Triton's tl.dot and "
            "of matmuls with TF32 allowed. The sign: the parallel path differs from the "
            "non-parallel one on the same inputs, and the difference grows with the context "
            "length (a positive slope of error against length). Not for a dot whose error does "
            "not accumulate: one TF32 product per output is usually within tolerance.",
        "transformation":
            "Ask for the higher-precision mode on the accumulating dot only:\n\n"
            "-    M = tl.dot(M_chunk, M)\n"
            "+    M = tl.dot(M_chunk, M, input_precision=\"tf32x3\")\n\n"
            "tf32x3 splits each FP32 operand into a TF32 high part and a TF32 residual "
            "(a = a_hi + a_lo) and sums three tensor-core products (a_hi*b_hi + a_hi*b_lo + "
            "a_lo*b_hi), close to FP32 accuracy. Leave the other dots as they are. Hold the fix "
            "in place with a regression test comparing the parallel path with the non-parallel "
            "one at growing lengths: the error must stay flat.",
        "resource_constraints":
            "About three times the tensor-core work of that one dot; the merge is a small share "
            "of the kernel, so measure the whole kernel. No extra memory worth noting. Needs a "
            "Triton with input_precision (3.0 or later); where there are no TF32 tensor cores "
            "the dot is IEEE FP32 already.",
        "provenance": "KDA context-parallel merge, FLA (fla-org/flash-linear-attention)",
        "provenance_url": "https://github.com/fla-org/flash-linear-attention/pull/1180",
    },
    {
        "slug": "release-gil-around-native-waits",
        "name": "Release the GIL around native waits",
        "summary": "A native call that blocks on the device releases the GIL while it waits, "
                   "so that the other Python threads (a KV-transfer thread) run beside it.",
        "applicability": [
            {"field": "bottleneck", "op": "in", "value": ["serialized-threads", "gil"]},
            {"field": "layer", "op": "in", "value": ["behaviour", "performance", "e2e"]},
        ],
        "applicability_prose":
            "A Python thread calls into C++/CUDA (a communication library's dispatch and "
            "combine, a synchronising copy) and the call keeps the GIL while the CPU waits on "
            "the GPU, so another Python thread that should overlap it (the KV transfer) stalls. "
            "The sign: on the timeline the two threads' spans never overlap, and the scenario "
            "with the second thread is much slower than the one without it (Prefill + KV "
            "transfer more than 5% behind Prefill only). Not for a call that touches Python "
            "objects while it waits.",
        "transformation":
            "Release the GIL for the blocking part of the native call, and take it back before "
            "touching any Python object. In a pybind11 binding, for the whole call:\n\n"
            "-    .def(\"intranode_dispatch\", &Buffer::intranode_dispatch)\n"
            "+    .def(\"intranode_dispatch\", &Buffer::intranode_dispatch,\n"
            "+         py::call_guard<py::gil_scoped_release>())\n\n"
            "or inside the function, around the wait alone:\n\n"
            "+    {\n"
            "+        py::gil_scoped_release release;\n"
            "         cudaStreamSynchronize(stream);  // or the wait on the GPU's counters\n"
            "+    }\n\n"
            "Python callbacks and tensors' reference counts need the GIL: take it back "
            "(py::gil_scoped_acquire) before them.",
        "resource_constraints":
            "No CPU or GPU cost. A correctness risk: a Python object touched while the GIL is "
            "released is a data race (reviewed as concurrency). Needs the native code's source "
            "and a rebuild of the extension.",
        "provenance": "DeepEP v1.2.1 dispatch holding the GIL (deepseek-ai/DeepEP)",
        "provenance_url": "https://github.com/deepseek-ai/DeepEP",
    },
    {
        "slug": "fuse-per-tile-work",
        "name": "Fuse repeated per-tile work into one block",
        "summary": "When the tiles of one dimension each repeat the same normalisation and "
                   "gating, merge them into one thread block, keep the intermediates in "
                   "registers and do the shared work once, with one warp/row-level reduction.",
        "applicability": [
            {"field": "op_class", "op": "in",
             "value": ["decode", "attention", "recurrence", "normalization"]},
            {"field": "layer", "op": "in", "value": ["performance", "e2e"]},
            {"field": "bottleneck", "op": "eq", "value": "compute"},
        ],
        "applicability_prose":
            "A kernel splits a dimension into tiles (the V dimension of a KDA decode kernel) "
            "and each tile's program recomputes the same FP32 work on the shared part (the "
            "normalisation of q and k, the gate), once per tile; the kernel is compute-bound "
            "(a profile or an engineer says so), and the dimension is small enough for one "
            "block to hold it (a head dimension of about 128). Not for a memory-bound kernel: "
            "there the tiles' parallelism is what hides the latency.",
        "transformation":
            "Make one program handle every tile of the dimension: loop over the tiles inside "
            "it, compute the shared normalisation and gating once, keep the intermediates in "
            "registers, and replace the per-tile reductions with one warp/row-level "
            "reduction:\n\n"
            "-grid = (batch * heads, triton.cdiv(V, BLOCK_V))  # a program per V tile\n"
            "+grid = (batch * heads,)                          # a program per head\n"
            " q = q / tl.sqrt(tl.sum(q * q) + eps)             # now once, not once per tile\n"
            " g = tl.exp(gate)\n"
            "+for v0 in range(0, V, BLOCK_V):\n"
            "+    ...  # the tile's update, reusing q, k and g from registers\n\n"
            "In CUDA the reduction is one __shfl_xor_sync butterfly per warp instead of a "
            "shared-memory round trip per tile.",
        "resource_constraints":
            "More registers per program (every tile's accumulators live at once): watch spills "
            "and occupancy. Fewer programs in the grid, so a small batch may leave SMs idle. "
            "Measure end to end: in the case it gave 1.71x, after a version that was slower and "
            "one that gained 9.6%.",
        "provenance": "KDA decode kernel V-tiling (FLA)",
        "provenance_url": "https://github.com/fla-org/flash-linear-attention",
    },
]


def seed(apps: Any, schema_editor: Any) -> None:
    Skeleton = apps.get_model("skeletons", "Skeleton")
    for entry in SEEDS:
        Skeleton.objects.get_or_create(slug=entry["slug"],
                                       defaults={**entry, "status": "reviewed"})


def unseed(apps: Any, schema_editor: Any) -> None:
    apps.get_model("skeletons", "Skeleton").objects.filter(
        slug__in=[entry["slug"] for entry in SEEDS], uses__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [("skeletons", "0001_initial")]

    operations = [migrations.RunPython(seed, unseed)]
