"""The index layer's public functions refuse wrong types and values with a message naming the parameter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from shardwise import index
from tests.contract.test_bad_input_data import check_row

Call = Callable[[Path], object]
V, T = ValueError, TypeError


def _save(directory: Path) -> None:
    np.save(directory / "values.npy", np.arange(3))


ARANGE = np.arange(3)
UINT = np.arange(3, dtype=np.uint64)
ROWS: list[tuple[str, Call, type[BaseException], tuple[str, ...]]] = [
    # -- build_or_open ------------------------------------------------------------------------------
    ("open-kind-int", lambda tmp: index.build_or_open(3, "k", _save, cache_dir=tmp), V, ("kind", "3")),  # type: ignore[arg-type]
    ("open-kind-slash", lambda tmp: index.build_or_open("a/b", "k", _save, cache_dir=tmp), V, ("kind", "'a/b'")),
    ("open-key-int", lambda tmp: index.build_or_open("k", 5, _save, cache_dir=tmp), T, ("key", "5")),  # type: ignore[arg-type]
    ("open-build-none", lambda tmp: index.build_or_open("k", "k", None, cache_dir=tmp), T, ("build", "None")),  # type: ignore[arg-type]
    ("open-build-no-arg", lambda tmp: index.build_or_open("k", "k", lambda: None, cache_dir=tmp), T, ("build",)),  # type: ignore[arg-type]
    ("open-replaces-str", lambda tmp: index.build_or_open("k", "k", _save, cache_dir=tmp, replaces="old"), T,  # type: ignore[arg-type]
     ("replaces", "'old'")),
    ("open-timeout-str", lambda tmp: index.build_or_open("k", "k", _save, cache_dir=tmp, timeout="9"), T,  # type: ignore[arg-type]
     ("timeout", "'9'")),
    ("open-timeout-negative", lambda tmp: index.build_or_open("k", "k", _save, cache_dir=tmp, timeout=-1), V,
     ("timeout", "-1")),
    # -- remove_entries, entry_name, store_index_dir ------------------------------------------------
    ("remove-root-none", lambda tmp: index.remove_entries(None, "k", lambda key: True), T, ("root", "None")),  # type: ignore[arg-type]
    ("remove-kind-empty", lambda tmp: index.remove_entries(tmp, "", lambda key: True), V, ("kind", "''")),
    ("remove-stale-int", lambda tmp: index.remove_entries(tmp, "k", 5), T, ("stale", "5")),  # type: ignore[arg-type]
    ("entry-name-kind-int", lambda tmp: index.entry_name(1, "k"), V, ("kind", "1")),  # type: ignore[arg-type]
    ("entry-name-key-int", lambda tmp: index.entry_name("k", 2), T, ("key", "2")),  # type: ignore[arg-type]
    ("store-index-dir-none", lambda tmp: index.store_index_dir(None), T, ("store_path", "None")),  # type: ignore[arg-type]
    # -- key_of, length_index ------------------------------------------------------------------------
    ("key-of-none", lambda tmp: index.key_of(None), T, ("values", "None")),
    ("key-of-objects", lambda tmp: index.key_of([object()]), T, ("values", "object")),
    ("length-index-none", lambda tmp: index.length_index(None, cache_dir=tmp), T, ("lengths", "None")),
    ("length-index-floats", lambda tmp: index.length_index([1.5, 2.0], cache_dir=tmp), T, ("lengths", "float64")),
    ("length-index-2d", lambda tmp: index.length_index([[1, 2], [3, 4]], cache_dir=tmp), V, ("lengths", "(2, 2)")),
    ("length-index-negative", lambda tmp: index.length_index([3, -1], cache_dir=tmp), V, ("lengths", "-1")),
    ("length-index-timeout", lambda tmp: index.length_index([3], cache_dir=tmp, timeout=None), T, ("timeout", "None")),  # type: ignore[arg-type]
    # -- order_by_key, key_counts, index_dtype -----------------------------------------------------
    ("order-directory-none", lambda tmp: index.order_by_key([1, 2], None), T, ("directory", "None")),  # type: ignore[arg-type]
    ("order-chunk-zero", lambda tmp: index.order_by_key([1, 2], tmp, chunk=0), V, ("chunk", "0")),
    ("order-chunk-float", lambda tmp: index.order_by_key([1, 2], tmp, chunk=2.0), T, ("chunk", "2.0")),  # type: ignore[arg-type]
    ("order-name-int", lambda tmp: index.order_by_key([1, 2], tmp, name=3), T, ("name", "3")),  # type: ignore[arg-type]
    ("order-num-keys-str", lambda tmp: index.order_by_key([1, 2], tmp, num_keys="3"), T, ("num_keys", "'3'")),  # type: ignore[arg-type]
    ("order-keys-none", lambda tmp: index.order_by_key(None, tmp), T, ("keys", "None")),
    ("counts-num-keys-zero", lambda tmp: index.key_counts([1, 2], num_keys=0), V, ("num_keys", "0")),
    ("counts-chunk-bool", lambda tmp: index.key_counts([1, 2], chunk=True), T, ("chunk", "True")),
    ("index-dtype-str", lambda tmp: index.index_dtype("3"), T, ("n", "'3'")),  # type: ignore[arg-type]
    ("index-dtype-negative", lambda tmp: index.index_dtype(-1), V, ("n", "-1")),
    # -- GroupedIndex, group_keys, permute_within ----------------------------------------------------
    ("grouped-order-none", lambda tmp: index.GroupedIndex(None, np.array([0])), T, ("order", "None")),  # type: ignore[arg-type]
    ("grouped-offsets-floats", lambda tmp: index.GroupedIndex(ARANGE, np.array([0.0, 3.0])), T, ("offsets", "float64")),
    ("grouped-order-2d", lambda tmp: index.GroupedIndex(np.zeros((2, 2), int), np.array([0, 4])), V, ("order", "(2, 2)")),
    ("group-keys-key-str", lambda tmp: index.group_keys("a", ARANGE), T, ("key", "'a'")),  # type: ignore[arg-type]
    ("group-keys-groups-floats", lambda tmp: index.group_keys(1, np.array([0.5])), T, ("groups", "float64")),
    ("permute-shapes", lambda tmp: index.permute_within(ARANGE, ARANGE[:2] + 1, UINT), V, ("ranks", "sizes", "(2,)")),
    ("permute-ranks-floats", lambda tmp: index.permute_within(np.zeros(3), ARANGE + 1, UINT), T, ("ranks", "float64")),
    # -- read_checked, set_progress ------------------------------------------------------------------
    ("set-progress-str", lambda tmp: index.set_progress("off"), T, ("enabled", "'off'")),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("call", "error", "names"), [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_index_bad_input_raises_naming_the_parameter(
    tmp_path: Path, call: Call, error: type, names: tuple[str, ...]
) -> None:
    """The call raises the expected exception type, and its message names the parameter (and value)."""
    check_row(tmp_path, call, error, names)


def test_a_bad_build_is_refused_even_when_the_entry_exists(tmp_path: Path) -> None:
    """build=None is an error at the call, not only when a build is needed (an existing entry used to hide it)."""
    index.build_or_open("k", "k", _save, cache_dir=tmp_path)
    with pytest.raises(TypeError, match="build should be a callable"):
        index.build_or_open("k", "k", None, cache_dir=tmp_path)  # type: ignore[arg-type]
