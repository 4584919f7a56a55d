"""``SizedPlanSampler``: the shell of index samplers over ``n`` samples, with torch's per-rank sizes."""

from __future__ import annotations

import types
from typing import Any

from torch.utils.data.distributed import DistributedSampler

from .._core.errors import check_bool, check_int
from .._core.plan import Even, rank_count
from .base import PlanSampler


class SizedPlanSampler(PlanSampler[int], DistributedSampler[int]):
    """A ``DistributedSampler`` whose epoch is a plan over ``_size`` samples (``ShardedSampler``, ``LocalitySampler``).

    ``num_samples`` and ``total_size`` are torch's attributes, derived from the data size and the
    world size resolved now (a sampler is often built before the process group).
    NOTE [ Assigned num_samples ]: a subclass with its own ``__iter__`` may assign them, as torch's
    ``ElasticDistributedSampler`` does: the attributes read the assigned values from then on, and
    ``len()`` returns ``num_samples``, as torch's ``__len__`` does. A subclass that keeps this
    class's ``__iter__`` yields the shardwise plan, whose length is fixed by the data and the world
    size: assigning another value would make ``len()`` and the pass disagree, so it is refused, with
    the fix; assigning the value the plan deals keeps it derived. ``drop_last`` assigned after
    construction applies from the next epoch's pass, as torch reads it when iterating.
    """

    _size: int
    """Samples in the data, hence positions in every epoch's plan."""

    _assigned_num_samples: int | None = None
    _assigned_total_size: int | None = None

    def __class_getitem__(cls, item: Any) -> Any:
        # ``ShardedSampler[int]``, as ``DistributedSampler[int]``: the class, parametrised for readers.
        return types.GenericAlias(cls, item)

    @property
    def num_samples(self) -> int:  # derived from the data size and the world size resolved now, or assigned
        """Indices per rank per epoch (torch's attribute)."""
        if self._assigned_num_samples is not None:
            return self._assigned_num_samples
        return rank_count(self._size, 0, self.num_replicas, self._even)

    @num_samples.setter
    def num_samples(self, value: int) -> None:
        value = check_int("num_samples", value, minimum=0)
        dealt = rank_count(self._size, 0, self.num_replicas, self._even)
        self._assigned_num_samples = self._assigned("num_samples", value, dealt)

    @property
    def total_size(self) -> int:  # derived, as num_samples, or assigned
        """Indices per epoch over all ranks, padding included (torch's attribute)."""
        if self._assigned_total_size is not None:
            return self._assigned_total_size
        return self.num_samples * self.num_replicas

    @total_size.setter
    def total_size(self, value: int) -> None:
        value = check_int("total_size", value, minimum=0)
        self._assigned_total_size = self._assigned("total_size", value, self.num_samples * self.num_replicas)

    def _assigned(self, name: str, value: int, dealt: int) -> int | None:
        """What an assignment to ``name`` keeps: NOTE [ Assigned num_samples ]."""
        if type(self).__iter__ is not PlanSampler.__iter__:
            return value  # the subclass yields its own units: its numbers, as on torch's sampler
        if value == dealt:
            return None  # what the plan deals: stays derived, following the world size
        kind = type(self).__name__
        raise ValueError(
            f"{name} should be what {kind} deals at world size {self.num_replicas} ({dealt}: it yields the shardwise "
            f"plan of {self._size} samples), but got {name}={value!r}; to yield {value} a rank, override __iter__ "
            "(and __len__) in the subclass, as torchelastic's ElasticDistributedSampler does, or do not assign "
            f"{name} (it is derived from the data and the world size)"
        )

    def __len__(self) -> int:
        """Units this rank yields in a full pass; an assigned ``num_samples`` (NOTE [ Assigned num_samples ])."""
        if self._assigned_num_samples is not None:
            return self._assigned_num_samples
        return super().__len__()

    @property
    def drop_last(self) -> bool:  # the plan's Even, which a pass deals
        """Cut the tail so ranks get equal lengths, instead of padding it (torch's attribute)."""
        return self._even is Even.DROP

    @drop_last.setter
    def drop_last(self, value: bool) -> None:
        drop_last = check_bool("drop_last", value)
        self._refuse_mid_epoch("drop_last")
        self._even = Even.DROP if drop_last else Even.PAD
