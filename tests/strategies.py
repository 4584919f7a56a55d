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
