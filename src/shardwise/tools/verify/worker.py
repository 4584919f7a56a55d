"""What runs inside each fresh process: call the factory as a rank would, iterate, record.

One process computes one or several ranks (simulated mode) or exactly its own rank (``spawn``).
For each rank it sets what a launcher sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ...), seeds
the global ``random``/``numpy``/``torch`` generators with that rank's own seed (independent
processes are seeded differently), calls the factory and iterates the units it yields. Nothing is
loaded from the dataset: the index source (``loader.batch_sampler``, or ``loader.sampler`` when
there is no batching) is iterated directly.

In simulated mode ``torch.distributed`` answers ``is_initialized``, ``get_rank`` and
``get_world_size`` for the simulated rank, so a sampler that asks the process group (torch's
``DistributedSampler()`` without arguments) is verified without one; a collective fails, and the
report says to verify with ``spawn=True``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import random
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .target import FactoryRef, TargetError, call_factory

RUN_ID = "shardwise-verify"
MASTER_PORT = "29500"
_CLEARED_ENV = (
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK",
    "PMI_SIZE",
)
PATHS = ("loader.sampler", "loader.batch_sampler", "loader.batch_sampler.sampler")
"""Where frameworks call ``set_epoch``; a bare sampler is seen as the DataLoader it would be put in."""


class IterationError(RuntimeError):
    """The sampler raised while being iterated (or never ended an epoch)."""


@dataclass(frozen=True)
class Setup:
    """How one job is verified: the same in every process."""

    world_size: int
    epochs: int
    local_world_size: int
    seeds_a: tuple[int, ...]
    seeds_b: tuple[int, ...]
    max_units: int
    dataset_size: int | None = None
    lengths: np.ndarray | None = None
    simulated: bool = True


@dataclass
class Epoch:
    """The units one rank yielded in one epoch: ``flat`` indices, step ``k`` is ``flat[offsets[k]:offsets[k+1]]``."""

    flat: np.ndarray
    offsets: np.ndarray
    length: int | None
    """``len()`` of the index source just before the epoch (None: it has no ``len``)."""

    @property
    def steps(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def head(self, k: int) -> np.ndarray:
        return self.flat[: self.offsets[min(k, self.steps)]]

    def tail(self, k: int) -> Epoch:
        """Steps ``k`` onwards (what a resume at step ``k`` must yield)."""
        k = min(k, self.steps)
        return Epoch(self.flat[self.offsets[k] :], self.offsets[k:] - self.offsets[k], None)

    def same(self, other: Epoch) -> bool:
        return np.array_equal(self.offsets, other.offsets) and np.array_equal(self.flat, other.flat)


@dataclass
class RankRun:
    rank: int
    epochs: list[Epoch]
    error: str | None = None
    """Why a resume could not load its state (the epochs are then empty)."""


@dataclass
class Probe:
    """What rank 0's objects are and which framework's ``set_epoch`` reaches the order."""

    kind: str
    loader: bool
    set_epoch_on: dict[str, str | None]
    """Per path, the class name of the object there when it has ``set_epoch``, else None."""
    frameworks: dict[str, bool]
    """Per framework, whether its way of calling ``set_epoch(1)`` changes the order from epoch 0's."""
    changes_without_calls: bool
    unreached: list[str]
    not_shuffled: bool
    holder: str | None
    elastic: bool
    dataset_size: int | None
    lengths: np.ndarray | None
    describe: str


@dataclass
class Saved:
    rank: int
    step: int
    holder: str
    state: bytes | None = None
    error: str | None = None
    before: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


# -- the environment of one rank ------------------------------------------------------------------


def launcher_env(rank: int, world_size: int, local_world_size: int) -> dict[str, str]:
    """What torchrun sets for ``rank`` of ``world_size`` on nodes of ``local_world_size`` processes."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank % local_world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(rank // local_world_size),
        "NODE_RANK": str(rank // local_world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": MASTER_PORT,
        "TORCHELASTIC_RUN_ID": RUN_ID,
    }


def nodes_for(world_size: int) -> int:
    """Processes per simulated node: two nodes when the world splits evenly (so local rank != rank)."""
    return world_size // 2 if world_size >= 2 and world_size % 2 == 0 else world_size


def seed_globals(seed: int) -> None:
    """Seed every global generator a sampler might read, as a process's own seeding would."""
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (the legacy global state is what user samplers read)
    torch.manual_seed(seed)


@contextlib.contextmanager
def simulated_group(rank: int, world_size: int) -> Iterator[None]:
    """Answer ``torch.distributed``'s rank queries for a simulated rank (no collective works)."""
    import torch.distributed as dist

    names = ("is_available", "is_initialized", "get_rank", "get_world_size")
    saved = {name: getattr(dist, name) for name in names}
    fakes: dict[str, Callable[..., Any]] = {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "get_rank": lambda group=None: rank,
        "get_world_size": lambda group=None: world_size,
    }
    for name, fake in fakes.items():
        setattr(dist, name, fake)
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


# -- one factory call ----------------------------------------------------------------------------


def _is_loader(obj: object) -> bool:
    from torch.utils.data import DataLoader

    return isinstance(obj, DataLoader) or all(hasattr(obj, a) for a in ("batch_sampler", "sampler", "dataset"))


def _label(obj: object) -> str:
    return type(obj).__name__


class Instance:
    """One rank's object from one factory call, with its index source and ``set_epoch`` paths."""

    def __init__(self, obj: Any, kind: str | None) -> None:
        from torch.utils.data import BatchSampler, IterableDataset

        self.obj = obj
        self.loader = _is_loader(obj)
        if self.loader:
            if isinstance(getattr(obj, "dataset", None), IterableDataset):
                raise TargetError(
                    "the factory returned a DataLoader over an IterableDataset, which has no sampler to verify; "
                    "return the sampler or batch sampler instead"
                )
            self.source = obj.batch_sampler if obj.batch_sampler is not None else obj.sampler
            self.kind = "batch" if obj.batch_sampler is not None else "index"
        elif hasattr(obj, "__iter__"):
            self.source = obj
            self.kind = kind or ("batch" if isinstance(obj, BatchSampler) else _peek_kind(obj))
        else:
            raise TargetError(
                f"the factory returned an object of type {_label(obj)}; it should return a Sampler, a batch "
                "sampler or a DataLoader"
            )

    def view(self) -> dict[str, Any]:
        """The objects at each of ``PATHS``, as frameworks see them (None: nothing there)."""
        obj = self.obj
        if self.loader:
            batch_sampler = obj.batch_sampler
            return {
                "loader.sampler": obj.sampler,
                "loader.batch_sampler": batch_sampler,
                "loader.batch_sampler.sampler": getattr(batch_sampler, "sampler", None) if batch_sampler else None,
            }
        if self.kind == "index":  # DataLoader(dataset, sampler=obj): loader.batch_sampler is torch's BatchSampler
            return {"loader.sampler": obj, "loader.batch_sampler": None, "loader.batch_sampler.sampler": obj}
        # DataLoader(dataset, batch_sampler=obj): loader.sampler is a SequentialSampler with no set_epoch
        return {"loader.sampler": None, "loader.batch_sampler": obj, "loader.batch_sampler.sampler": _attr(obj)}

    def set_epoch_everywhere(self, epoch: int) -> None:
        _call_set_epoch(list(self.view().values()), epoch)


def _attr(obj: object, name: str = "sampler") -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:  # a property that cannot answer has nothing there
        return None


def _peek_kind(obj: Any) -> str:
    try:
        first = next(iter(obj), None)
    except Exception as error:
        raise IterationError(f"iterating the sampler raised {type(error).__name__}: {error}") from None
    scalar = isinstance(first, (int, np.integer)) or getattr(first, "ndim", None) == 0
    return "index" if first is None or scalar else "batch"


def _call_set_epoch(objects: list[Any], epoch: int) -> None:
    from ...samplers.set_epoch import epoch_target

    seen: set[int] = set()
    for obj in objects:
        target = epoch_target(obj)
        if target is None or id(target) in seen:
            continue
        seen.add(id(target))
        method = getattr(target, "set_epoch", None)
        if callable(method):
            method(epoch)


# The ways frameworks set the epoch (with their default settings), on the paths of Instance.view.
def _pytorch(view: dict[str, Any], epoch: int) -> None:
    # The recipe calls set_epoch on the object the script built: the sampler, else the batch sampler.
    sampler = view["loader.sampler"]
    _call_set_epoch([sampler if callable(getattr(sampler, "set_epoch", None)) else view["loader.batch_sampler"]], epoch)


def _lightning(view: dict[str, Any], epoch: int) -> None:
    _call_set_epoch([view["loader.sampler"], view["loader.batch_sampler.sampler"]], epoch)


def _accelerate(view: dict[str, Any], epoch: int) -> None:
    _call_set_epoch([view["loader.batch_sampler"], view["loader.batch_sampler.sampler"]], epoch)


def _composer(view: dict[str, Any], epoch: int) -> None:
    from torch.utils.data import DistributedSampler

    # Composer's _get_distributed_sampler: the batch sampler if it is a DistributedSampler, else the sampler.
    for path in ("loader.batch_sampler", "loader.sampler"):
        if isinstance(view[path], DistributedSampler):
            view[path].set_epoch(epoch)
            return


FRAMEWORKS: dict[str, Callable[[dict[str, Any], int], None]] = {
    "PyTorch recipe (the sampler or batch sampler built)": _pytorch,
    "Lightning (loader.sampler, loader.batch_sampler.sampler)": _lightning,
    "Accelerate (loader.batch_sampler, its .sampler)": _accelerate,
    "Composer (whichever is a DistributedSampler)": _composer,
}


# -- iterating ------------------------------------------------------------------------------------


def _as_indices(units: list[Any], kind: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        if kind == "index":
            flat = np.fromiter((int(u) for u in units), dtype=np.int64, count=len(units))
            return flat, np.arange(len(units) + 1, dtype=np.int64)
        arrays = [np.asarray(u).astype(np.int64, copy=False).reshape(-1) for u in units]
    except (TypeError, ValueError) as error:
        raise IterationError(
            f"the sampler yielded a unit verify cannot read as indices ({type(error).__name__}: {error}); "
            "it should yield integers (a sampler) or lists of integers (a batch sampler)"
        ) from None
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([a.size for a in arrays])
    flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
    return flat, offsets


def iterate(instance: Instance, max_units: int, *, steps: int | None = None) -> Epoch:
    """One pass over the index source (or its first ``steps`` units), as a training loop would."""
    source = instance.source
    try:
        length: int | None = len(source)
    except TypeError:
        length = None
    except Exception as error:
        raise IterationError(f"len() of the sampler raised {type(error).__name__}: {error}") from None
    limit = max_units + 1 if steps is None else steps
    try:
        units = list(itertools.islice(iter(source), limit))
    except Exception as error:
        raise IterationError(f"iterating the sampler raised {type(error).__name__}: {error}") from None
    if steps is None and len(units) > max_units:
        raise IterationError(
            f"one epoch did not end after {max_units} units: verify checks samplers whose epochs end "
            "(pass dataset_size to raise the limit)"
        )
    flat, offsets = _as_indices(units, instance.kind)
    return Epoch(flat, offsets, length)


# -- the work of one rank -------------------------------------------------------------------------


class Worker:
    """Does one job's work in this process; keeps the kind learnt from the first instance."""

    def __init__(self, ref: FactoryRef, setup: Setup) -> None:
        self.ref = ref
        self.setup = setup
        self.factory = ref.load()
        self.kind: str | None = None

    @contextlib.contextmanager
    def rank_context(self, rank: int, world_size: int) -> Iterator[None]:
        env = launcher_env(rank, world_size, nodes_for(world_size))
        for name in _CLEARED_ENV:
            os.environ.pop(name, None)
        os.environ.update(env)
        if self.setup.simulated or world_size != self.setup.world_size:  # an elastic resume is always simulated
            with simulated_group(rank, world_size):
                yield
        else:
            yield

    def build(self, rank: int, seed: int, world_size: int | None = None) -> Instance:
        """Seed the globals with ``seed``, call the factory as ``rank``, and wrap what it returned."""
        world_size = world_size or self.setup.world_size
        instance = Instance(self._call(rank, seed, world_size), self.kind)
        if not instance.loader and self.kind is None:
            # Peeking drew from the sampler (and perhaps the global generators): learn the kind
            # once per process, then build afresh under the same seeds.
            self.kind = instance.kind
            instance = Instance(self._call(rank, seed, world_size), self.kind)
        return instance

    def _call(self, rank: int, seed: int, world_size: int) -> Any:
        seed_globals(seed)
        try:
            return call_factory(self.factory, rank, world_size)
        except TargetError:
            raise
        except Exception as error:
            hint = ""
            if "process group" in str(error).lower() and self.setup.simulated:
                hint = " (it needs a real process group: verify with spawn=True, or --spawn)"
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise TargetError(
                f"calling {self.ref.label} as rank {rank} of {world_size} raised {type(error).__name__}: {first}{hint}"
            ) from None

    def run(self, rank: int, seed: int) -> RankRun:
        """Every epoch of ``rank``, the epoch set on every path first (as the union of all frameworks does)."""
        setup = self.setup
        instance = self.build(rank, seed)
        epochs = []
        for epoch in range(setup.epochs):
            instance.set_epoch_everywhere(epoch)
            epochs.append(iterate(instance, setup.max_units))
        return RankRun(rank, epochs)

    def probe(self, seed: int) -> Probe:
        """Rank 0: which framework's ``set_epoch`` changes the order, and what the objects are."""
        setup = self.setup
        base = self.build(0, seed)
        first = iterate(base, setup.max_units)
        second = iterate(base, setup.max_units)
        view = base.view()
        reached = {}
        for name, call in FRAMEWORKS.items():
            fresh = self.build(0, seed)
            call(fresh.view(), 1)
            reached[name] = not iterate(fresh, setup.max_units).same(first)
        holder = _holder(view)
        holder_obj = view[holder] if holder else None
        from ...samplers.base import PlanSampler
        from ...samplers.set_epoch import epoch_target

        walked = _walk(base.obj, "loader" if base.loader else "sampler")
        called = {id(epoch_target(v)) for v in view.values() if v is not None}
        return Probe(
            kind=base.kind,
            loader=base.loader,
            set_epoch_on={
                path: _label(epoch_target(obj)) if callable(getattr(epoch_target(obj), "set_epoch", None)) else None
                for path, obj in view.items()
            },
            frameworks=reached,
            changes_without_calls=not second.same(first),
            unreached=[
                f"{name} ({_label(obj)})"
                for name, obj in walked
                if id(obj) not in called and callable(getattr(obj, "set_epoch", None))
            ],
            not_shuffled=any(vars(obj).get("shuffle") is False for _, obj in walked if hasattr(obj, "__dict__")),
            holder=holder,
            elastic=holder_obj is not None
            and (isinstance(holder_obj, PlanSampler) or getattr(holder_obj, "elastic", False) is True),
            dataset_size=setup.dataset_size if setup.dataset_size is not None else _dataset_size(base, view),
            lengths=setup.lengths if setup.lengths is not None else _lengths(view),
            describe=_describe(base.obj),
        )

    def save(self, rank: int, seed: int, step: int) -> Saved | None:
        """Iterate ``step`` steps of epoch 0 and save the state, as a mid-epoch checkpoint does (None: no state)."""
        instance = self.build(rank, seed)
        holder = _holder(instance.view())
        if holder is None:
            return None
        instance.set_epoch_everywhere(0)
        before = iterate(instance, self.setup.max_units, steps=step)
        saved = Saved(rank, step, holder, before=before.flat)
        try:
            saved.state = pickle.dumps(instance.view()[holder].state_dict())
        except Exception as error:
            saved.error = f"{holder}.state_dict() raised {type(error).__name__}: {error}"
        return saved

    def resume(
        self, rank: int, seed: int, saved: Saved, world_size: int | None = None, epochs: int | None = None
    ) -> RankRun:
        """Load a saved state in this fresh process, set the epoch as frameworks do after loading, iterate."""
        instance = self.build(rank, seed, world_size)
        if saved.state is None:
            return RankRun(rank, [], error=saved.error or "no state was saved")
        try:
            instance.view()[saved.holder].load_state_dict(pickle.loads(saved.state))
        except Exception as error:
            return RankRun(rank, [], error=f"{saved.holder}.load_state_dict() raised {type(error).__name__}: {error}")
        runs = []
        for epoch in range(epochs or self.setup.epochs):
            instance.set_epoch_everywhere(epoch)
            runs.append(iterate(instance, self.setup.max_units))
        return RankRun(rank, runs)


def _holder(view: dict[str, Any]) -> str | None:
    """The path of the object whose state a checkpoint saves: the batch sampler's, else the sampler's."""
    for path in ("loader.batch_sampler", "loader.sampler", "loader.batch_sampler.sampler"):
        obj = view[path]
        if (
            obj is not None
            and callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
        ):
            return path
    return None


def _size_of(value: Any) -> int | None:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    try:
        return len(value)
    except Exception:
        return None


def _dataset_size(instance: Instance, view: dict[str, Any]) -> int | None:
    if instance.loader:
        return _size_of(instance.obj.dataset)
    for obj in (view["loader.sampler"], view["loader.batch_sampler"], view["loader.batch_sampler.sampler"]):
        for name in ("dataset", "data_source"):
            value = _attr(obj, name) if obj is not None else None
            if value is not None and (size := _size_of(value)) is not None:
                return size
    return None


def _lengths(view: dict[str, Any]) -> np.ndarray | None:
    for obj in view.values():
        value = _attr(obj, "lengths") if obj is not None else None
        if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
            return value
    return None


_LEAVES = (str, bytes, int, float, bool, type(None), np.ndarray)


def _walk(root: Any, name: str, depth: int = 3, limit: int = 300) -> list[tuple[str, Any]]:
    """Objects reachable from ``root`` through instance attributes (a few levels), with dotted names."""
    import torch

    found: list[tuple[str, Any]] = [(name, root)]
    seen = {id(root)}
    level = [(name, root)]
    for _ in range(depth):
        nested = []
        for prefix, obj in level:
            items = list(vars(obj).items()) if hasattr(obj, "__dict__") and not isinstance(obj, type) else []
            for key, value in items:
                if isinstance(value, (list, tuple)) and len(value) <= 16:
                    pairs = [(f"{prefix}.{key}[{i}]", v) for i, v in enumerate(value)]
                else:
                    pairs = [(f"{prefix}.{key}", value)]
                for child_name, child in pairs:
                    if isinstance(child, (_LEAVES, torch.Tensor)) or id(child) in seen:
                        continue
                    if callable(child) and not hasattr(child, "__iter__"):
                        continue
                    seen.add(id(child))
                    found.append((child_name, child))
                    nested.append((child_name, child))
                    if len(found) >= limit:
                        return found
        level = nested
    return found


def _describe(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 200 else text[:197] + "..."


# -- entry points ---------------------------------------------------------------------------------


def _error(kind: str, error: BaseException) -> dict[str, Any]:
    return {"error": kind, "message": str(error), "traceback": traceback.format_exc(limit=-4)}


def do_items(ref: FactoryRef, setup: Setup, items: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Run one job's work items in this process; every result keyed by item.

    Items: ``("one", rank)`` runs A, A again, B, a mid-epoch save and (rank 0 or ``probe_all``) the probe;
    ``("two", rank, saved)`` runs C and the resume from ``saved``; ``("elastic", rank, world_size, saved)``.
    """
    results: dict[str, Any] = {}
    try:
        worker = Worker(ref, setup)
        for item in items:
            what, rank = item[0], item[1]
            world_size = item[2] if what == "elastic" else setup.world_size
            with worker.rank_context(rank, world_size):
                if what == "one":
                    results[f"A/{rank}"] = run_a = worker.run(rank, setup.seeds_a[rank])
                    results[f"A2/{rank}"] = worker.run(rank, setup.seeds_a[rank])
                    results[f"B/{rank}"] = worker.run(rank, setup.seeds_b[rank])
                    if rank == 0 or item[-1] == "probe":
                        results[f"probe/{rank}"] = worker.probe(setup.seeds_a[0])
                    step = run_a.epochs[0].steps // 2
                    if step >= 1:
                        results[f"saved/{rank}"] = worker.save(rank, setup.seeds_a[rank], step)
                elif what == "two":
                    results[f"C/{rank}"] = worker.run(rank, setup.seeds_a[rank])
                    if item[2] is not None:
                        results[f"resumed/{rank}"] = worker.resume(rank, setup.seeds_a[rank], item[2])
                else:
                    saved = item[3]
                    results[f"elastic/{rank}"] = worker.resume(rank, setup.seeds_a[0], saved, world_size, epochs=1)
    except TargetError as error:
        return _error("target", error)
    except IterationError as error:
        return _error("iterate", error)
    except Exception as error:
        return _error("iterate", RuntimeError(f"{type(error).__name__}: {error}"))
    return results


def main(argv: list[str]) -> int:
    """``python -m shardwise.tools.verify PAYLOAD RESULT``: run every job of a pickled payload."""
    payload_path, result_path = argv
    with open(payload_path, "rb") as handle:
        jobs = pickle.load(handle)
    out = [do_items(ref, setup, items) for ref, setup, items in jobs]
    with open(result_path, "wb") as handle:
        pickle.dump(out, handle, protocol=pickle.HIGHEST_PROTOCOL)
    return 0
