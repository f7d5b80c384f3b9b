"""How the decode kernel splits the V dimension into blocks: pure Python (no numpy), so the
instruction-count probe can run the kernel's own loop structure under callgrind quickly.

v2 tiles V into TILES blocks and, in each, recomputes the same FP32 normalisation of q and
k and the same gating: TILES times the work. MERGE_TILES = True is v3: one block, the
normalisation and gating computed once and kept (in registers, in the real kernel).
"""

TILES = 4
MERGE_TILES = False


def blocks(dv):
    """The column ranges (start, stop) of V that one decode step works through."""
    count = 1 if MERGE_TILES else TILES
    width = dv // count
    return [(b * width, (b + 1) * width) for b in range(count)]
