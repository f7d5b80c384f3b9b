import unittest

import numpy as np

from bench.cp_inputs import SHARD, inputs
from kda import merge


class MergeTest(unittest.TestCase):
    def setUp(self):
        self.precision = merge.INPUT_PRECISION

    def tearDown(self):
        merge.INPUT_PRECISION = self.precision

    def test_tf32_keeps_ten_mantissa_bits(self):
        x = np.float32(1 + 2**-10 + 2**-12)
        self.assertEqual(merge.tf32(np.array([x]))[0], np.float32(1 + 2**-10))

    def test_the_parallel_path_matches_the_sequential_one_in_full_precision(self):
        merge.INPUT_PRECISION = "ieee"
        q, h, s0 = inputs(0, 256, 0)
        np.testing.assert_allclose(merge.context_parallel(q, h, s0, SHARD),
                                   merge.sequential(q, h, s0), rtol=1e-4, atol=1e-4)

    def test_tf32x3_is_closer_to_fp32_than_tf32(self):
        rng = np.random.default_rng(1)
        a, b = rng.standard_normal((2, 16, 16)).astype(np.float32)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        errors = {}
        for precision in ("tf32", "tf32x3"):
            merge.INPUT_PRECISION = precision
            errors[precision] = np.max(np.abs(merge.dot(a, b) - exact))
        self.assertLess(errors["tf32x3"] * 50, errors["tf32"])


if __name__ == "__main__":
    unittest.main()
