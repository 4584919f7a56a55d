"""What runs inside each fresh process: call the factory as a rank would, iterate, record.

One process computes one or several ranks (simulated mode) or exactly its own rank (``spawn``).
For each rank it sets what a launcher sets (:mod:`.launcher`), calls the factory, wraps what it
returned (:mod:`.objects`) and iterates the units it yields, the epoch set as frameworks set it
(:mod:`.recipes`). Nothing is loaded from the dataset: the index source (``loader.batch_sampler``,
or ``loader.sampler`` when there is no batching) is iterated directly.
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .launcher import nodes_for, rank_environment, seed_globals
from .objects import Instance, IterationError, dataset_size, describe, holder, label, lengths, walk
from .recipes import FRAMEWORKS, set_epoch_everywhere
from .target import FactoryRef, TargetError, call_factory

__all__ = ["Epoch", "IterationError", "Probe", "RankRun", "Saved", "Setup", "Worker", "do_items", "main", "nodes_for"]


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
        # An elastic resume (another world size) is always simulated.
        simulated = self.setup.simulated or world_size != self.setup.world_size
        with rank_environment(rank, world_size, simulated=simulated):
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
            set_epoch_everywhere(instance.view(), epoch)
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
        holds = holder(view)
        holder_obj = view[holds] if holds else None
        from ...samplers.base import PlanSampler
        from ...samplers.set_epoch import epoch_target

        walked = walk(base.obj, "loader" if base.loader else "sampler")
        called = {id(epoch_target(v)) for v in view.values() if v is not None}
        return Probe(
            kind=base.kind,
            loader=base.loader,
            set_epoch_on={
                path: label(epoch_target(obj)) if callable(getattr(epoch_target(obj), "set_epoch", None)) else None
                for path, obj in view.items()
            },
            frameworks=reached,
            changes_without_calls=not second.same(first),
            unreached=[
                f"{name} ({label(obj)})"
                for name, obj in walked
                if id(obj) not in called and callable(getattr(obj, "set_epoch", None))
            ],
            not_shuffled=any(vars(obj).get("shuffle") is False for _, obj in walked if hasattr(obj, "__dict__")),
            holder=holds,
            elastic=holder_obj is not None
            and (isinstance(holder_obj, PlanSampler) or getattr(holder_obj, "elastic", False) is True),
            dataset_size=setup.dataset_size if setup.dataset_size is not None else dataset_size(base, view),
            lengths=setup.lengths if setup.lengths is not None else lengths(view),
            describe=describe(base.obj),
        )

    def save(self, rank: int, seed: int, step: int) -> Saved | None:
        """Iterate ``step`` steps of epoch 0 and save the state, as a mid-epoch checkpoint does (None: no state)."""
        instance = self.build(rank, seed)
        holds = holder(instance.view())
        if holds is None:
            return None
        set_epoch_everywhere(instance.view(), 0)
        before = iterate(instance, self.setup.max_units, steps=step)
        saved = Saved(rank, step, holds, before=before.flat)
        try:
            saved.state = pickle.dumps(instance.view()[holds].state_dict())
        except Exception as error:
            saved.error = f"{holds}.state_dict() raised {type(error).__name__}: {error}"
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
            set_epoch_everywhere(instance.view(), epoch)
            runs.append(iterate(instance, self.setup.max_units))
        return RankRun(rank, runs)


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
