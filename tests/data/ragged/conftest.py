"""Fixtures of the ragged store's tests: 50 sample arrays and a store written from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardwise import RaggedArray
from tests.data.ragged.stores import _samples


@pytest.fixture
def arrays() -> list:
    return _samples()


@pytest.fixture
def store(tmp_path: Path, arrays: list) -> RaggedArray:
    return RaggedArray.write(tmp_path / "store", arrays)
