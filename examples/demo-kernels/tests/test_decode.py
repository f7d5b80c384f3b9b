import unittest

import numpy as np

from kernel import decode, tiling


class DecodeTest(unittest.TestCase):
    def setUp(self):
        self.merged = tiling.MERGE_TILES

    def tearDown(self):
        tiling.MERGE_TILES = self.merged

    def step(self, merged):
        tiling.MERGE_TILES = merged
        rng = np.random.default_rng(0)
        q, k, g = (rng.standard_normal(16).astype(np.float32) for _ in range(3))
        v = rng.standard_normal(32).astype(np.float32)
        state = np.ones((16, 32), dtype=np.float32)
        return decode.decode_step(q, k, v, g, state), state

    def test_the_blocks_cover_every_column_once(self):
        for merged in (False, True):
            tiling.MERGE_TILES = merged
            columns = [c for start, stop in tiling.blocks(64) for c in range(start, stop)]
            self.assertEqual(columns, list(range(64)))

    def test_one_block_computes_what_four_do(self):
        tiled, merged = self.step(False), self.step(True)
        np.testing.assert_allclose(tiled[0], merged[0], rtol=1e-6)
        np.testing.assert_allclose(tiled[1], merged[1], rtol=1e-6)


if __name__ == "__main__":
    unittest.main()
