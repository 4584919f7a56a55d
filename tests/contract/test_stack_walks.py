"""What shardwise reads from the Python stack lives in one module, each reading listed and tested.

``shardwise.samplers.callers`` holds every walk up the frames; this contract keeps it so: no other
module of ``src/`` touches a frame, every walk is in ``callers.WALKS``, names the framework whose
tested version it serves, and names a test that runs it inside that framework's real loop.
"""

from __future__ import annotations

import ast
import inspect
import re
import warnings
from pathlib import Path

from torch.utils.data import DataLoader, SequentialSampler

from shardwise import ShardedSampler, shard
from shardwise._core.foreign import TESTED
from shardwise.samplers import callers

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "shardwise"
FRAME_ACCESS = re.compile(r"\b(_getframe|currentframe|f_back|f_locals|f_globals|getouterframes|inspect\.stack)\b")


def test_no_module_but_callers_reads_a_frame() -> None:
    readers = sorted(
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path != Path(callers.__file__) and FRAME_ACCESS.search(path.read_text(encoding="utf-8"))
    )
    assert readers == [], f"these modules read the stack: move the walk into samplers/callers.py ({readers})"


def test_every_walk_is_listed_once_with_its_framework_and_what_it_does_when_it_finds_nothing() -> None:
    source = Path(callers.__file__).read_text(encoding="utf-8")
    tree = ast.parse(source)

    def reads_frames(function: ast.FunctionDef) -> bool:
        names = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)}
        attributes = {n.attr for n in ast.walk(function) if isinstance(n, ast.Attribute)}
        return "_frames" in names or "_getframe" in attributes

    walking = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and reads_frames(node)
    }
    listed = [walk.function for walk in callers.WALKS]
    assert sorted(listed) == sorted(walking) and len(set(listed)) == len(listed)
    for walk in callers.WALKS:
        assert walk.library in TESTED or walk.library == "python", walk
        assert walk.infers and walk.otherwise, walk
        if walk.library in TESTED:  # the docstring names the version the frames were read from
            major_minor = ".".join(TESTED[walk.library].split(".")[:2])
            doc = inspect.getdoc(getattr(callers, walk.function)) or ""
            assert major_minor in doc.split(":")[0], (walk.function, major_minor)


def test_every_walk_names_a_test_that_runs_it_in_its_framework() -> None:
    for walk in callers.WALKS:
        path, _, name = walk.test.partition("::")
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert name in names, f"{walk.function}: {walk.test} does not exist"


def test_walks_find_nothing_outside_the_frameworks() -> None:
    """Called by hand (no DataLoader, torchdata, Accelerate or Lightning frame): every walk says "none"."""
    assert callers.loader_iterator(0) is None
    assert callers.called_by(object(), 0) is False
    assert callers.torchdata_snapshotting(0) is False
    assert callers.torchdata_replayed_steps(0) == 0
    assert callers.accelerate_resharder(0) is None
    assert callers.lightning_fit_loop(0) is None


def test_a_plain_loader_is_found_and_a_sampler_iterated_by_hand_is_not() -> None:
    sampler = ShardedSampler(10, num_replicas=2, rank=0, seed=0)
    assert list(sampler) and sampler.state_dict()["consumed"] == 10  # by hand: what it handed out
    sampler.set_epoch(1)
    loader = DataLoader(range(10), sampler=sampler, batch_size=2)
    first = next(iter(loader))
    assert len(first) == 2
    assert sampler.state_dict()["consumed"] == 4  # the loader was found: one batch of 2 per rank, 2 ranks


def test_warn_outside_points_at_the_line_outside_shardwise() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shard(SequentialSampler(range(4)), even="pad", num_replicas=1, rank=0)  # through two shardwise frames
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert [Path(w.filename).name for w in deprecations] == [Path(__file__).name]
