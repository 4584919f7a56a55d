"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st

world_sizes = st.integers(min_value=1, max_value=8)
seeds = st.integers(min_value=0, max_value=2**64 - 1)
epochs = st.integers(min_value=0, max_value=10_000)


@st.composite
def world_and_size(draw: st.DrawFn) -> tuple[int, int]:
    """A world size W in 1..8 and a data size n in 0..3W+1 (every tail shape: empty, short, ragged)."""
    world_size = draw(world_sizes)
    return world_size, draw(st.integers(min_value=0, max_value=3 * world_size + 1))


domain_sizes = st.one_of(
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=2**16 + 1, max_value=2**17),  # Feistel path, small enough to check whole
)


@st.composite
def mixture_weights(draw: st.DrawFn) -> tuple[list[int], list[float]]:
    """1 to 5 source sizes and weights: small integers (exact ratios) or floats (rounded to 2**-30), one positive."""
    count = draw(st.integers(min_value=1, max_value=5))
    sizes = draw(st.lists(st.integers(min_value=1, max_value=60), min_size=count, max_size=count))
    if draw(st.booleans()):
        weights = [float(w) for w in draw(st.lists(st.integers(0, 9), min_size=count, max_size=count))]
    else:
        weights = draw(st.lists(st.one_of(st.just(0.0), st.floats(0.05, 1.0)), min_size=count, max_size=count))
    if not any(weights):
        weights[draw(st.integers(0, count - 1))] = 1.0
    return sizes, weights
