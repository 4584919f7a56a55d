"""``SizedPlanSampler``: the shell of index samplers over ``n`` samples, with torch's per-rank sizes."""

from __future__ import annotations

from torch.utils.data.distributed import DistributedSampler

from .._core.plan import rank_count
from .base import PlanSampler


class SizedPlanSampler(PlanSampler[int], DistributedSampler[int]):
    """A ``DistributedSampler`` whose epoch is a plan over ``_size`` samples (``ShardedSampler``, ``LocalitySampler``).

    ``num_samples`` and ``total_size`` are torch's attributes, derived from the data size and the
    world size resolved now (a sampler is often built before the process group).
    """

    _size: int
    """Samples in the data, hence positions in every epoch's plan."""

    @property
    def num_samples(self) -> int:  # type: ignore[override]  # derived from the data size and the world size resolved now
        """Indices per rank per epoch (torch's attribute)."""
        return rank_count(self._size, 0, self.num_replicas, self._even)

    @property
    def total_size(self) -> int:  # type: ignore[override]  # derived, as num_samples
        """Indices per epoch over all ranks, padding included (torch's attribute)."""
        return self.num_samples * self.num_replicas
