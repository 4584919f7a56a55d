"""``rebase_state``: the documented override for resuming a state on data that changed.

A shardwise state carries a fingerprint of the data and configuration it was saved for (sizes,
digests of lengths, labels or weights, the sources of a mixture), and ``load_state_dict`` refuses
a state of other data, naming the first field that differs. When the change is intended (a fixed
shard, a few samples removed), ``sampler.load_state_dict(rebase_state(state, sampler))`` resumes
at the saved epoch and plan position of the **new** plan, with a warning listing every difference.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from .._core.errors import MalformedStateError
from .._core.state import FINGERPRINT
from .base import PlanSampler

__all__ = ["rebase_state"]


def fingerprint_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``"field: saved -> current"`` for every field that differs between two fingerprints."""
    changes = []
    for name in sorted(set(saved) | set(current)):
        before, after = saved.get(name, "<absent>"), current.get(name, "<absent>")
        if before != after:
            changes.append(f"{name}: {before!r} -> {after!r}")
    return changes


def rebase_state(state: Mapping[str, Any], sampler: PlanSampler[Any]) -> dict[str, Any]:
    """A copy of ``state`` that ``sampler`` loads although its data changed: the fingerprint is the sampler's.

    The epoch, position, seed and skip ledger are kept; the position now indexes the new data's plan
    (so which samples follow it is not what the old data would have given). Warns with every field
    that differs. The state must come from the same kind of sampler.

    Raises:
        MalformedStateError: ``state`` is not a shardwise state.
        ValueError: ``state`` was saved by another kind of sampler.

    Example:
        >>> from shardwise import ShardedSampler, rebase_state
        >>> state = ShardedSampler(100, num_replicas=1, rank=0).state_dict()
        >>> grown = ShardedSampler(120, num_replicas=1, rank=0)
        >>> import warnings
        >>> with warnings.catch_warnings(record=True):
        ...     grown.load_state_dict(rebase_state(state, grown))
    """
    if not isinstance(state, Mapping) or not isinstance(state.get(FINGERPRINT), Mapping):
        raise MalformedStateError(f"state should be a dict from state_dict() with a fingerprint, but got {state!r:.80}")
    current = sampler.state_dict()[FINGERPRINT]
    saved = state[FINGERPRINT]
    if saved.get("kind") != current.get("kind"):
        raise ValueError(
            f"state was saved by {saved.get('kind')!r}, but this sampler is {current.get('kind')!r}; rebase_state "
            "adopts other data for the same kind of sampler, not another sampler"
        )
    changes = fingerprint_changes(saved, current)
    if changes:
        warnings.warn(
            f"resuming {current.get('kind')} on changed data ({'; '.join(changes)}): the saved position now "
            "indexes the new plan",
            UserWarning,
            stacklevel=2,
        )
    rebased = dict(state)
    rebased[FINGERPRINT] = dict(current)
    return rebased
