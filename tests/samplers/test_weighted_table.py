"""The weight table's build: quantisation in blocks, against the reference it replaced."""

from __future__ import annotations

import numpy as np

from shardwise.index.weights import count_positive, quantise


def _reference_quantise(weights: np.ndarray) -> np.ndarray:
    """The quantisation as first written: ldexp, floor, the support kept, one cumulative sum."""
    scale = (62 - len(weights).bit_length()) - int(np.frexp(float(weights.max()))[1])
    units = np.floor(np.ldexp(weights.astype(np.float64), scale)).astype(np.int64)
    return np.cumsum(np.maximum(units, weights > 0))


def test_quantise_in_blocks_equals_the_reference_and_counts_the_support() -> None:
    """Blocks of 2**16, the exact multiply (or ldexp for tiny weights): the reference's sums, the positive
    count of count_positive, every block handed out once, in order."""
    rng = np.random.default_rng(11)
    cases = [
        rng.exponential(size=200_001).astype(np.float32),
        rng.exponential(size=70_000) ** 8 * 1e-310,  # largest tiny: 2**scale is not a normal double
        rng.integers(0, 5, 140_000),
        np.array([0.0, 3.0, 0.0]),
    ]
    cases[0][rng.random(cases[0].size) < 0.2] = 0
    for weights in cases:
        pieces: list[np.ndarray] = []
        cdf, positive = quantise(weights, on_block=lambda part: pieces.append(part.copy()))
        assert np.array_equal(cdf, _reference_quantise(weights))
        assert np.array_equal(np.concatenate(pieces), cdf)
        assert positive == count_positive(cdf) == int(np.count_nonzero(weights))
