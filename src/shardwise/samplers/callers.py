"""Who is calling: every place shardwise reads the Python stack, one function a framework, and why.

A plain ``DataLoader`` tells its sampler nothing: not which of its iterators pulls a pass, not
how many of the batches it drew reached the training loop, not that a framework's snapshot is the
caller of ``state_dict``, not that a framework wrapped it to deal it out again. Where a framework
gives an explicit path, shardwise takes it (``shardwise.integrations``: Accelerate's
``prepare_data_loader``, ``ShardwiseTrainer``, torchdata's ``StatefulDataLoader`` state, the
Lightning callbacks); where it gives none, the frames that called the sampler are the only
witness. Each such reading is one function here, and nowhere else in shardwise
(``tests/contract/test_stack_walks.py`` scans for frame access):

- it is named for the framework and the frames it recognises, a few frames deep, and runs once a
  pass (once a ``state_dict`` / ``load_state_dict`` call for torchdata's snapshots);
- every name of the framework it recognises is a row of ``_core.foreign.PRIVATE``, checked against
  the installed version when the framework is met (torch's here, at import), like every foreign name;
- :data:`WALKS` says what it infers, what happens when it finds nothing, and the test that runs it
  inside the framework's real loop; docs/design.md ("What is read from the stack") shows the table.

A walk returns plain values and holds no frame after it returns: a frame holds the loader
iterator (its ``self``), which holds the sampler's generator, and that cycle would keep the
iterator, and its worker processes, alive after the loop is left, until a garbage collection.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from types import FrameType
from typing import Any

from torch.utils.data import dataloader as _dataloader

from .._core.foreign import check, private

check("torch")  # the names below: one clear error naming the torch to pin, not a silent miscount

_BASE_ITER = private("torch", "_BaseDataLoaderIter")
_LOADER_DEPTH = 4  # our generator <- [BatchSampler.__iter__ | torchdata _BatchSamplerIterator] <- _next_index
_SNAPSHOTTERS = ("torchdata.stateful_dataloader.",)
_SNAPSHOT_DEPTH = 3  # state_dict's caller, or the callers of an override that calls super().state_dict()
_STEPS_SINCE_SNAPSHOT = private("torchdata", "_STEPS_SINCE_SNAPSHOT")  # a class constant: the key's name
_NEXT_ITER_STATE = private("torchdata", "next_iter_state")
_REPLAY_DEPTH = 8  # load_state_dict [<- overrides] [<- torchdata's batch iterator] <- _restore_main_state <- __init__
_RESHARDERS = {("accelerate.data_loader", "BatchSamplerShard")}
_RESHARD_DEPTH = 4  # our __iter__ <- torch BatchSampler.__iter__ <- BatchSamplerShard._iter_with[_no]_split <- __iter__
_FIT_LOOP = private("lightning", "_FitLoop")
_SETUP_DATA = private("lightning", "setup_data")
_LIGHTNING_DEPTH = 32  # our generator <- torch's prefetch in the iterator's __init__ <- ... <- FitLoop.setup_data
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Walk:
    """One reading of the stack: the function, the framework it serves, and what it decides."""

    function: str
    library: str
    """The framework whose frames it recognises (a key of ``_core.foreign.TESTED``: the version tested)."""
    infers: str
    otherwise: str
    """What happens when the walk finds nothing (the framework is absent, renamed or called another way)."""
    test: str
    """The test that runs the walk inside the framework's real loop (``path::name``)."""


WALKS: tuple[Walk, ...] = (
    Walk("loader_iterator", "torch",
         "which DataLoader iterator pulls a pass, to read the batches it delivered to the loop",
         "the pass counts the units it handed out (no DataLoader: the same; a DataLoader whose workers prefetch: "
         "state_dict() warns and names StatefulDataLoader)",
         "tests/contract/test_crash_resume.py::test_sampler_state_after_k_batches_of_a_loader_with_workers_resumes_at_batch_k_plus_1"),
    Walk("called_by", "torch",
         "that a loader iterator with persistent workers is restarting the pass it drives: what it delivered is final",
         "the pass counts what it handed out",
         "tests/integrations/test_torchdata.py::test_recipe_with_persistent_workers_resumes_at_the_next_epoch"),
    Walk("torchdata_snapshotting", "torchdata",
         "that torchdata's StatefulDataLoader takes its snapshot: state_dict() answers the handed-out position",
         "state_dict() answers the trained position (what any other caller gets)",
         "tests/contract/test_crash_resume.py::test_sampler_state_read_directly_while_a_stateful_loader_with_workers_drives_it_is_exact"),
    Walk("torchdata_replayed_steps", "torchdata",
         "the steps torchdata's restoring iterator replays after the snapshot being loaded",
         "0 steps: a snapshot of another world size loads unrefused",
         "tests/integrations/test_torchdata.py::test_a_snapshot_replayed_at_another_world_size_is_refused_and_one_at_its_step_resumes_exactly"),
    Walk("accelerate_resharder", "accelerate",
         "that accelerator.prepare() wrapped the sampler in BatchSamplerShard, which would deal it a second time",
         "the sampler is iterated: each rank would get 1/W of its share (prepare_data_loader is the explicit path)",
         "tests/integrations/test_accelerate.py::test_batch_sampler_shard_around_a_shardwise_sampler_is_refused_before_any_batch"),
    Walk("lightning_fit_loop", "lightning",
         "that Lightning's FitLoop.setup_data pulls a pass before it sets the epoch, to adopt the epoch it will set",
         "the workers prefetch the sampler's own epoch (after a resume at an epoch's last step: the finished one)",
         "tests/integrations/test_lightning.py::test_a_step_checkpoint_at_an_epochs_last_batch_with_workers_resumes_at_the_next_epoch"),
    Walk("outside_stacklevel", "python",
         "the stacklevel of the first frame outside shardwise, so that a warning points at the user's line",
         "the warning points at a line inside shardwise",
         "tests/samplers/test_skip_ids_adaptive.py::test_skip_ids_with_adaptive_weights_warns_at_the_callers_line"),
)  # fmt: skip
"""Every walk of this module (``tests/contract/test_stack_walks.py`` checks the list against the functions)."""


def _frames(depth: int, limit: int) -> list[FrameType]:
    """Up to ``limit`` frames from ``depth`` levels above the walk's caller (0: the caller itself)."""
    try:
        frame: FrameType | None = sys._getframe(depth + 2)  # 0: here, 1: the walk
    except ValueError:
        return []
    found: list[FrameType] = []
    while frame is not None and len(found) < limit:
        found.append(frame)
        frame = frame.f_back
    return found


def loader_iterator(depth: int) -> Any:
    """torch 2.13: the ``_BaseDataLoaderIter`` that called, ``depth`` frames up, the walk's caller, or ``None``.

    The iterator is the ``self`` of one of the few frames that pull a sampler: torch's ``_next_index``,
    directly for a batch sampler, through ``BatchSampler.__iter__`` for an index sampler.
    """
    base_iter = getattr(_dataloader, _BASE_ITER)
    for frame in _frames(depth, _LOADER_DEPTH):
        caller = frame.f_locals.get("self")
        if isinstance(caller, base_iter):
            return caller
    return None


def called_by(obj: object, depth: int) -> bool:
    """torch 2.13: whether ``obj`` (a loader iterator) is the ``self`` of one of the few frames ``depth`` above the
    walk's caller: ``_BaseDataLoaderIter._reset`` asking for a new sampler iterator (``persistent_workers``)."""
    return any(frame.f_locals.get("self") is obj for frame in _frames(depth, _LOADER_DEPTH))


def torchdata_snapshotting(depth: int) -> bool:
    """torchdata 0.11: whether the function that called the walk's caller (``depth`` frames up, or a few
    above: subclasses that override ``state_dict``) is torchdata's serialisation of a snapshot."""
    for frame in _frames(depth, _SNAPSHOT_DEPTH):
        name = frame.f_globals.get("__name__", "")
        if isinstance(name, str) and name.startswith(_SNAPSHOTTERS):
            return True
    return False


def torchdata_replayed_steps(depth: int) -> int:
    """torchdata 0.11: the steps its restoring iterator replays after loading the state that
    ``load_state_dict`` (``depth`` frames above the walk's caller) is loading; 0 when none, or not torchdata.

    torchdata's ``StatefulDataLoader`` with workers saves the snapshot it took last (one every
    ``snapshot_every_n_steps`` steps) and the count of steps since; its iterator's ``__init__``
    loads the snapshot, then pulls that many batches again and drops them. That ``__init__`` is
    among the frames calling ``load_state_dict`` and holds the loader's state (``next_iter_state``).
    """
    for frame in _frames(depth, _REPLAY_DEPTH):
        name = frame.f_globals.get("__name__", "")
        if isinstance(name, str) and name.startswith(_SNAPSHOTTERS) and frame.f_code.co_name == "__init__":
            restoring = frame.f_locals.get(_NEXT_ITER_STATE)
            key = getattr(type(frame.f_locals.get("self")), _STEPS_SINCE_SNAPSHOT, None)
            if isinstance(restoring, dict) and isinstance(key, str):
                steps = restoring.get(key, 0)
                return steps if isinstance(steps, int) and not isinstance(steps, bool) else 0
    return 0


def accelerate_resharder(depth: int) -> Any:
    """Accelerate 1.15: the ``BatchSamplerShard`` among the frames ``depth`` above the walk's caller, else ``None``.

    Found when ``accelerator.prepare()`` wrapped the sampler (its ``_iter_with_split`` or
    ``_iter_with_no_split`` calls torch's ``BatchSampler.__iter__``, which calls the sampler's).
    """
    for frame in _frames(depth, _RESHARD_DEPTH):
        caller = frame.f_locals.get("self")
        if caller is not None and (type(caller).__module__, type(caller).__name__) in _RESHARDERS:
            return caller
    return None


def lightning_fit_loop(depth: int) -> Any:
    """Lightning 2.6: the ``_FitLoop`` whose ``setup_data`` is among the frames from ``depth`` above the
    walk's caller (it creates the first iterator of a run before it sets the epoch), or ``None``."""
    if "lightning.pytorch" not in sys.modules:
        return None
    for frame in _frames(depth, _LIGHTNING_DEPTH):
        if frame.f_code.co_name == _SETUP_DATA:
            loop = frame.f_locals.get("self")
            if type(loop).__name__ == _FIT_LOOP and type(loop).__module__.startswith("lightning.pytorch."):
                return loop
    return None


def outside_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside shardwise, for a ``warnings.warn`` in the walk's caller."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def warn_outside(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` pointing at the first line outside shardwise (Python 3.12's ``skip_file_prefixes``)."""
    if sys.version_info >= (3, 12):
        warnings.warn(message, category, skip_file_prefixes=(_PACKAGE,))
    else:
        warnings.warn(message, category, stacklevel=outside_stacklevel())
