"""The state of a mixture's adaptive weights: this rank's pending report, the one collective, the ledger update.

The arithmetic (fixed-point sums, the ledger) is :mod:`shardwise._core.adaptive`, the policies
:mod:`shardwise._core.adaptive_policies`; this
module adds what needs torch: the all_reduce that makes every rank agree on the statistics.

NOTE [ One collective an update ]
An update all_reduces one int64 tensor of ``4 + 2 * S`` numbers: the update number and its
square, a tag of the sampler's configuration and its square, then the per-source fixed-point
sums and counts. Summed over ``W`` ranks, ``W * sum(u**2) == sum(u)**2`` only if every rank
reported the same update (likewise for the tag), so ranks that report different updates, or
samplers built differently, fail loudly on every rank instead of drawing from different weights.
The tensor lives where the group's backend reduces: on the CPU for gloo and MPI (also for a
``"cpu:gloo,cuda:nccl"`` group), else on the current accelerator device (``cuda`` for NCCL).
A rank that does not report at all stops at the next interval boundary
(:class:`~shardwise._core.mixture.PendingWeightsError`); the ranks waiting for it in the
collective fail at the group's timeout, or as soon as its process exits.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import numpy as np

from .._core.adaptive import (
    SHARE_DENOMINATOR,
    SourceStatistics,
    WeightLedger,
    check_values,
    fixed_point_sums,
    min_share_for,
    quantize_shares,
)
from .._core.adaptive_policies import AdaptiveWeights, initial_state, run_policy
from .._core.errors import MalformedStateError
from .._core.weights import Weights
from .._core.world import World
from .callers import warn_outside

TAG_BITS = 20

ADAPTIVE = "adaptive"
"""The state key of an adaptive mixture's weight ledger."""


class AdaptivePlan(Protocol):
    """What the adaptive side reads and writes of a mixture's plan (``MixturePlan``, ``TokenMixturePlan``).

    NOTE [ An adaptive ledger is a weight schedule written at run time ] (``_core/adaptive``): each
    update is a weight change at a run position; ``known_until`` is where the ledger's knowledge ends.
    """

    known_until: int | None

    def reveal_until(self, known_until: int) -> None: ...
    def epoch_start(self, epoch: int) -> int: ...
    def extend(self, threshold: int, weights: Weights, known_until: int) -> None: ...
    def check_known(self, epoch: int, positions: np.ndarray) -> None: ...
    def weights_at(self, epoch: int, position: int) -> list[float]: ...


PlanT = TypeVar("PlanT", bound=AdaptivePlan)


def config_tag(fingerprint: dict[str, Any]) -> int:
    """A 20-bit digest of a sampler's fingerprint: ranks whose samplers differ disagree on it."""
    text = json.dumps(fingerprint, sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=4).digest(), "big") >> (32 - TAG_BITS)


def collective_device(group: Any = None) -> Any:
    """Where the group's backend reduces a tensor: CPU for gloo/MPI, else the current accelerator device."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend or "mpi" in backend:
        return torch.device("cpu")
    accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    if accelerator is None:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


def all_reduce_report(sums: np.ndarray, counts: np.ndarray, update: int, tag: int, group: Any = None
                      ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Global ``(sums, counts)`` over the group's ranks, after checking that every rank reports ``update``/``tag``."""
    import torch
    import torch.distributed as dist

    header = np.asarray([update, update * update, tag, tag * tag], dtype=np.int64)
    payload = torch.from_numpy(np.concatenate([header, sums, counts])).to(collective_device(group))
    dist.all_reduce(payload, group=group)
    total = [int(x) for x in payload.cpu().tolist()]
    world = dist.get_world_size(group)
    if world * total[1] != total[0] ** 2:
        raise RuntimeError(
            f"the ranks reported different updates to the adaptive mixture (this rank reported update {update}; "
            f"over {world} ranks the update numbers sum to {total[0]}): every rank must call sampler.adaptive.update() "
            "once per interval, at the same step, from the same checkpoint"
        )
    if world * total[3] != total[2] ** 2:
        raise RuntimeError(
            f"the ranks' adaptive MixtureSamplers differ (configuration tag {tag} here, another on some rank): build "
            "the sampler with the same sizes, weights policy, interval, block and seed on every rank"
        )
    size = len(sums)
    return np.asarray(total[4 : 4 + size], dtype=np.int64), np.asarray(total[4 + size :], dtype=np.int64)


class Feedback:
    """The ledger of an adaptive mixture and this rank's report pending for the next update.

    ``epoch_size`` and ``block``: the plan's positions an epoch and a block, where the weights in
    force change (NOTE [ The weights that drew an interval ] in ``_core.adaptive``). ``least_share``:
    the least share a positive weight is drawn with (default: one position a block); a plan whose
    positions each hold every weighted source (a packed mixture's batches) passes 1.
    """

    __slots__ = ("adaptive", "block", "counts", "epoch_size", "least", "ledger", "lifted", "sums", "unit")

    def __init__(
        self,
        adaptive: AdaptiveWeights,
        initial: np.ndarray,
        block: int,
        epoch_size: int,
        least_share: int | None = None,
        unit: str = "samples",
    ) -> None:
        self.adaptive, self.block, self.epoch_size, self.unit = adaptive, block, epoch_size, unit
        self.least = min_share_for(block) if least_share is None else least_share  # a positive weight's least share
        self.lifted = False  # a policy's weight below the least share was lifted (warned once a sampler)
        shares = quantize_shares(initial, self.least)
        self.ledger = WeightLedger(adaptive.interval, shares, initial_state(adaptive.policy, initial), adaptive.lag)
        self.sums = np.zeros(len(initial), dtype=np.int64)
        self.counts = np.zeros(len(initial), dtype=np.int64)

    def record(self, values: object, sources: object) -> None:
        """Add per-sample values (losses) of the given sources to this rank's pending report."""
        floats, integers = check_values(values, sources, len(self.sums))
        sums, counts = fixed_point_sums(floats, integers, len(self.sums))
        self.sums += sums
        self.counts += counts

    def clear(self) -> None:
        self.sums[:] = 0
        self.counts[:] = 0

    def next_shares(self, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The next update's shares from the reduced ``(sums, counts)``: the policy, quantised (pure)."""
        update = self.ledger.updates + 1
        if not counts.any():
            warn_outside(  # at the loop's line, through any wrapper (an integration's hook)
                f"update {update} of the adaptive mixture has no reported samples on any rank (nothing was recorded "
                "since the last update: a resume from a checkpoint saved between an interval's end and its update?); "
                "the policy sees no statistics",
                RuntimeWarning,
            )
        ledger = self.ledger
        drawn = ledger.drawn((update - 1) * ledger.interval, update * ledger.interval, self.epoch_size, self.block)
        statistics = SourceStatistics.from_sums(update, sums, counts, drawn)
        step = run_policy(self.adaptive.policy, ledger, statistics)
        shares = self.block_shares(step.weights, update)
        ledger.append(shares, step.state)
        return shares

    def block_shares(self, weights: np.ndarray, update: int) -> np.ndarray:
        """The policy's weights as ledger shares, a positive weight below ``1 / block`` lifted to it (warned).

        NOTE [ A policy's weight below 1/block ] (docs/mixture.md): every block must draw each
        source with a positive weight at least once, so such a weight cannot be drawn as asked.
        Raising would stop a run at an update no one can foresee at construction, and the lift is
        deterministic (the same on every rank and on a resume), so the ledger records the lifted
        weights (what the plan draws, and what the policy sees next) and the first lift warns.
        """
        name = getattr(self.adaptive.policy, "__qualname__", type(self.adaptive.policy).__name__)
        least = self.least
        positive = int((weights > 0).sum())
        if positive * least > SHARE_DENOMINATOR:
            raise ValueError(
                f"the policy {name} gave {positive} sources a positive weight at update {update}, but a block of "
                f"{self.block} positions draws at most {SHARE_DENOMINATOR // least} of them; build the sampler with "
                f"block>={positive}, or return 0 for the sources to leave out"
            )
        shares = quantize_shares(weights, least)
        near = (weights > 0) & (weights / float(weights.sum()) * SHARE_DENOMINATOR < least)  # a lift is possible
        if not self.lifted and near.any():
            asked = quantize_shares(weights)
            low = np.flatnonzero((asked > 0) & (asked < least))
            if low.size:
                self.lifted = True
                smallest = float(asked[low].min()) / SHARE_DENOMINATOR
                need = -(-SHARE_DENOMINATOR // int(asked[low].min()))
                listed = ", ".join(f"source {i}: {asked[i] / SHARE_DENOMINATOR:.3g} -> "
                                   f"{shares[i] / SHARE_DENOMINATOR:.3g}" for i in low)  # fmt: skip
                warn_outside(  # at the loop's line, through any wrapper (an integration's hook)
                    f"update {update}: the policy {name} gave weights below 1/{self.block}, the least a block of "
                    f"{self.block} positions draws ({listed}); the ledger records them lifted to 1/{self.block}, taken "
                    f"from the largest weights, and the policy sees those from now on. Give the policy a floor of at "
                    f"least 1/{self.block}, return 0 to leave a source out, or build the sampler with block>={need} "
                    f"(for a weight of {smallest:.3g}); later lifts of this sampler are not warned again",
                    RuntimeWarning,
                )
        return shares

    def update(self, plan: AdaptivePlan, trained: int, fingerprint: dict[str, Any], world: World, group: Any
               ) -> list[float]:  # fmt: skip
        """Reduce the pending report over the ranks, run the policy, append to the ledger and the plan.

        ``trained``: the run position the loop has trained through (the update must be due).
        """
        import torch.distributed as dist

        ledger = self.ledger
        if trained < ledger.due_at:
            raise RuntimeError(
                f"update {ledger.updates + 1} is due once the loop has trained through run position {ledger.due_at} "
                f"(interval={ledger.interval} {self.unit} over all ranks), but it has trained through {trained}; call "
                "sampler.adaptive.update() when sampler.adaptive.update_due()"
            )
        if dist.is_available() and dist.is_initialized():
            sums, counts = all_reduce_report(self.sums, self.counts, ledger.updates + 1, config_tag(fingerprint), group)
        elif world.world_size == 1:
            sums, counts = self.sums, self.counts
        else:
            raise RuntimeError(
                f"sampler.adaptive.update() on rank {world.rank} of {world.world_size} needs an initialised "
                "torch.distributed process group to agree on the statistics with the other ranks"
            )
        shares = self.next_shares(sums, counts)
        self.clear()
        plan.extend(ledger.start_of(ledger.updates), as_weights(shares), ledger.known_until)
        return [float(x) / SHARE_DENOMINATOR for x in shares]

    def saved_ledger(self, state_dict: object, owner: str) -> WeightLedger:
        """The ledger a saved state holds (``state["adaptive"]``), checked against this interval and sources."""
        if not isinstance(state_dict, dict) or ADAPTIVE not in state_dict:
            raise MalformedStateError(
                f"state should hold 'adaptive' (the weight ledger) for a {owner} with adaptive weights; save "
                "sampler.state_dict() of an adaptive sampler"
            )
        ledger = self.ledger
        return WeightLedger.from_state(state_dict[ADAPTIVE], ledger.interval, len(self.sums), ledger.lag)

    def plan_of(self, ledger: WeightLedger, new_plan: Callable[[int], PlanT]) -> PlanT:
        """The plan of a loaded ``ledger``: the initial weights, then every update's; it becomes this ledger."""
        self.ledger = ledger
        self.clear()
        plan = new_plan(self.block)
        for entry in range(1, ledger.updates + 1):
            plan.extend(ledger.start_of(entry), as_weights(ledger.shares[entry]), ledger.start_of(entry + 1))
        plan.reveal_until(ledger.known_until)
        return plan


def as_weights(shares: np.ndarray) -> Weights:
    """A ledger row as the plan's exact weights."""
    return Weights(tuple(int(x) for x in shares), SHARE_DENOMINATOR)
