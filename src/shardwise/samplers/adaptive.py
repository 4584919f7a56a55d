"""``sampler.adaptive``: the adaptive weights of a mixture, an object of their own.

A mixture built with ``weights=AdaptiveWeights(...)`` answers ``sampler.adaptive`` with an
:class:`AdaptiveMixture` (:class:`PackedAdaptiveMixture` for ``PackedMixtureSampler``): the ledger,
``record`` each step, ``update`` when ``update_due``. A mixture of fixed weights or a schedule
answers ``None``, so it has no method that raises because of how it was built.

NOTE [ Adaptive weights read their sampler through a link ]
The object holds the sampler's :class:`~shardwise.samplers.feedback.Feedback` (the ledger and this
rank's pending report: the state) and reads the sampler through what the sampler gives it at
construction: its public side (:class:`MixtureShell`: the plan, its sizes, the world) and three
callables (the position the loop trained through, the fingerprint the ranks agree on, what the
live pass does after an update). ``sampler.adaptive`` builds it on each access, bound to that
sampler: a ``copy.copy`` or an unpickled sampler (DataLoader workers, ``ddp_spawn``) answers for
itself, and one held across ``load_state_dict`` reads the plan the resume built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import numpy as np

from .._core.adaptive import WeightLedger
from .._core.adaptive_policies import AdaptiveWeights
from .._core.errors import check_int
from .._core.state import Fingerprint
from .._core.world import World
from .callers import warn_outside
from .feedback import AdaptivePlan, Feedback


class MixturePlanView(Protocol):
    """What the adaptive weights read of a mixture's ``sampler.plan``: its core is an ``AdaptivePlan``."""

    @property
    def core(self) -> AdaptivePlan: ...
    def size(self, epoch: int) -> int: ...
    def uncompacted(self, epoch: int, positions: np.ndarray) -> np.ndarray: ...


class MixtureShell(Protocol):
    """The public side of a mixture sampler its adaptive weights read (a resume replaces ``plan.core``)."""

    @property
    def plan(self) -> MixturePlanView: ...
    @property
    def world(self) -> World: ...
    def sources_of(self, indices: Any) -> np.ndarray: ...


def weights_in_force(plan: AdaptivePlan, epoch: int, position: int, size: int) -> list[float]:
    """The weights ``plan`` draws plan ``position`` of ``epoch`` with (``size``: the epoch's plan size).

    Raises:
        PendingWeightsError: no update has set the weights of that position yet.
    """
    epoch = check_int("epoch", epoch, minimum=0)
    position = check_int("position", position, minimum=0, maximum=max(0, size - 1))
    plan.check_known(epoch, np.asarray([position], dtype=np.int64))
    return plan.weights_at(epoch, position)


class AdaptiveMixture:
    """A mixture's adaptive weights: the ledger, ``record`` each step, ``update`` when ``update_due``.

    ``sampler.adaptive`` of a ``MixtureSampler`` built with ``weights=AdaptiveWeights(...)`` (else
    ``None``). NOTE [ An adaptive ledger is a weight schedule written at run time ] (``_core/adaptive``);
    NOTE [ Adaptive weights read their sampler through a link ] (this module).

    Example:
        >>> import shardwise
        >>> sampler = shardwise.MixtureSampler([100, 100], shardwise.AdaptiveWeights(shardwise.Exp3(), interval=8),
        ...                                    num_samples=16, num_replicas=1, rank=0)
        >>> adaptive = sampler.adaptive
        >>> adaptive.record([0.5, 2.0], [0, 1]); adaptive.pending
        2
        >>> adaptive.update_due(), adaptive.update_due(position=8)  # nothing trained yet; 8 positions trained
        (False, True)
        >>> adaptive.update(position=8), adaptive.ledger.updates, adaptive.pending
        ([0.5, 0.5], 1, 0)
    """

    __slots__ = ("_feedback", "_fingerprint", "_sampler", "_trained", "_updated")

    def __init__(
        self,
        feedback: Feedback,
        sampler: MixtureShell,
        *,
        trained: Callable[[], tuple[int, int]],
        fingerprint: Callable[[], Fingerprint],
        updated: Callable[[], None] | None = None,
    ) -> None:
        """``trained``: the sampler's ``(epoch, consumed)`` the loop trained through; ``fingerprint``: what
        the ranks' samplers must agree on; ``updated``: called after each update (the live pass follows)."""
        self._feedback, self._sampler = feedback, sampler
        self._trained, self._fingerprint, self._updated = trained, fingerprint, updated

    @property
    def config(self) -> AdaptiveWeights:
        """The :class:`AdaptiveWeights` the sampler was built with (``policy``, ``interval``, ``lag``, ...)."""
        return self._feedback.adaptive

    @property
    def ledger(self) -> WeightLedger:
        """The weights of every update so far (entry 0: the initial weights), the same on every rank."""
        return self._feedback.ledger

    def record(self, values: Any, sources: Any) -> None:
        """Add per-sample values (losses) with each sample's source to this rank's report for the next update.

        Local and cheap (no communication); call it every step. ``sources`` are source numbers
        (``sampler.sources_of(indices)`` gives them from the batch's indices). Values are kept as
        fixed-point sums (NOTE [ Reported statistics are fixed-point ] in ``_core.adaptive``).

        Raises:
            ValueError: a non-finite value or one beyond ``2**20``, a source out of range, lengths that differ.
            TypeError: non-numeric values, non-integer sources.
        """
        self._feedback.record(values, sources)

    def trained_position(self, epoch: int | None = None, consumed: int | None = None) -> int:
        """The run position (samples of all epochs, all ranks) the loop has trained through.

        Counted by the sampler (what the loop received, see ``delivery``), or given as the
        ``(epoch, consumed)`` of a state the caller keeps (HF ``Trainer``, whose loader runs ahead).
        """
        if epoch is None or consumed is None:
            epoch, consumed = self._trained()
        else:
            epoch, consumed = check_int("epoch", epoch, minimum=0), check_int("consumed", consumed, minimum=0)
        sampler = self._sampler
        # Skipped positions (skip_steps) count as passed: intervals are of plan positions, as the weights are.
        # The end of the dealt plan maps to the end of the plan, skipped positions included (SkipLedger.to_plan).
        dealt = min(consumed, sampler.plan.size(epoch))
        position = int(sampler.plan.uncompacted(epoch, np.asarray([dealt], dtype=np.int64))[0])
        return sampler.plan.core.epoch_start(epoch) + position

    @property
    def pending(self) -> int:
        """Samples this rank recorded since the last update: a checkpoint now does not carry them.

        NOTE [ Resuming an adaptive mixture ] (docs/mixture.md): a resume from such a checkpoint
        computes the next update from what is recorded after it, so its weights can differ from the
        uninterrupted run's; checkpoint right after an update for an identical trajectory.
        """
        return int(self._feedback.counts.sum())

    def warn_if_pending(self) -> None:
        """Warn that a checkpoint taken now misses this rank's statistics since the last update."""
        pending = self.pending
        if pending:
            ledger = self._feedback.ledger
            warn_outside(  # at the caller's line, through any wrapper (the integrations' hooks)
                f"a checkpoint taken now misses the {pending} losses this rank recorded towards update "
                f"{ledger.updates + 1} (due at run position {ledger.due_at}): a resume from it computes that update "
                "from what is recorded after the resume, so the weights can differ from this run's. Checkpoint "
                "right after an update (every interval) for an identical trajectory",
                RuntimeWarning,
            )

    def update_due(self, position: int | None = None) -> bool:
        """Whether the loop has trained through the end of the interval the next update reports.

        ``position``: the run position trained through (a non-negative integer), when the caller
        counts it (else the sampler's).

        Raises:
            TypeError: ``position`` is not an integer (a bool, a float, a string).
            ValueError: ``position`` is negative.
        """
        trained = self.trained_position() if position is None else check_int("position", position, minimum=0)
        return trained >= self._feedback.ledger.due_at

    def update(self, group: Any = None, *, position: int | None = None) -> list[float]:
        """Agree on the recorded statistics with one all_reduce, append the policy's weights to the ledger.

        Call it on every rank when :meth:`update_due` (the same step on every rank); the new
        weights take effect ``lag`` intervals later. Without an initialised process group the sampler
        must be alone (``world_size == 1``). NOTE [ One collective an update ] (``samplers/feedback``)
        says where the tensor lives and how disagreeing ranks fail. ``position`` as for :meth:`update_due`.

        Returns:
            The new weights as the ledger records them (shares summing to 1): the policy's, with a
            positive weight below ``1 / block`` lifted to it (warned at the first lift; NOTE [ A
            policy's weight below 1/block ] in docs/mixture.md).

        Raises:
            RuntimeError: the update is not due yet; the ranks report different updates or have
                differently built samplers; several ranks but no process group.
            TypeError, ValueError: ``position`` is not a non-negative integer.
        """
        trained = self.trained_position() if position is None else check_int("position", position, minimum=0)
        sampler = self._sampler
        shares = self._feedback.update(sampler.plan.core, trained, self._fingerprint(), sampler.world, group)
        if self._updated is not None:
            self._updated()  # skipped ids the new weights draw leave the live pass (NOTE in samplers.mixture_reveal)
        return shares

    def on_clock(self, position: Callable[[int | None, int | None], int]) -> AdaptiveMixture:
        """These weights, with the position trained through counted by another sampler.

        A ``ScheduledBatchSampler`` over the mixture reads the mixture's plan without moving the mixture's
        position: the loop's progress is the batch sampler's. ``position(epoch, consumed)`` gives the run
        position trained through, from that sampler's own ``(epoch, consumed)`` (``None``: its current).
        The ledger, the recorded statistics and the update are the same objects.
        """
        clock = _OnClock(self._feedback, self._sampler, trained=self._trained, fingerprint=self._fingerprint,
                         updated=self._updated)  # fmt: skip
        clock._position = position
        return clock

    def __repr__(self) -> str:
        ledger = self._feedback.ledger
        return f"{type(self).__name__}({self.config!r}, updates={ledger.updates}, pending={self.pending})"


class _OnClock(AdaptiveMixture):
    """An :class:`AdaptiveMixture` whose trained position another sampler counts (:meth:`AdaptiveMixture.on_clock`)."""

    __slots__ = ("_position",)
    _position: Callable[[int | None, int | None], int]

    def trained_position(self, epoch: int | None = None, consumed: int | None = None) -> int:
        """The run position trained through, from the clock's sampler (or its state's ``(epoch, consumed)``)."""
        return self._position(epoch, consumed)


Adaptive = TypeVar("Adaptive", bound=AdaptiveMixture)


def bound_adaptive(
    kind: type[Adaptive],
    feedback: Feedback | None,
    sampler: MixtureShell,
    *,
    trained: Callable[[], tuple[int, int]],
    fingerprint: Callable[[], Fingerprint],
    updated: Callable[[], None] | None = None,
) -> Adaptive | None:
    """A mixture's ``sampler.adaptive``: ``kind`` bound to ``sampler``, or ``None`` without ``feedback``.

    The one body of ``MixtureSampler.adaptive`` and ``PackedMixtureSampler.adaptive``: a mixture of
    fixed weights or a schedule has no feedback and answers ``None``; an adaptive one builds its
    object on each access (NOTE [ Adaptive weights read their sampler through a link ]), O(1).
    ``trained``, ``fingerprint``, ``updated``: as :class:`AdaptiveMixture` takes them.
    """
    if feedback is None:
        return None
    return kind(feedback, sampler, trained=trained, fingerprint=fingerprint, updated=updated)


class PackedAdaptiveMixture(AdaptiveMixture):
    """``PackedMixtureSampler``'s adaptive weights: :class:`AdaptiveMixture` plus per-token reports.

    ``record_tokens`` reads each token's source from its document id; ``record_predictions`` does
    a causal LM's shift. ``interval`` counts batches over all ranks.
    """

    __slots__ = ()

    def record_tokens(self, losses: Any, sample_ids: Any, mask: Any = None) -> None:
        """Add per-token losses to this rank's report, each token's source read from its document id.

        ``sample_ids`` is a packed batch's (``batch.sample_ids``: the document each token came
        from, -1 on padding); ``losses`` the same shape (the loss of predicting each token; see
        docs/packed_mixture.md for a causal LM's shift). Tokens with a negative id or ``mask``
        false are left out. The policy sees each source's mean token loss.
        """
        ids = np.asarray(sample_ids.cpu() if hasattr(sample_ids, "cpu") else sample_ids).reshape(-1)
        values = np.asarray(losses.detach().cpu().double() if hasattr(losses, "detach") else losses).reshape(-1)
        if values.shape != ids.shape:
            raise ValueError(
                f"losses should have one value per token of sample_ids ({ids.size}), but got {values.size} values"
            )
        keep = ids >= 0
        if mask is not None:
            keep &= np.asarray(mask.cpu() if hasattr(mask, "cpu") else mask, dtype=bool).reshape(-1)
        self.record(values[keep], self._sampler.sources_of(ids[keep]))

    def record_predictions(self, losses: Any, labels: Any, sample_ids: Any) -> None:
        """:meth:`record_tokens` for a causal LM's packed batch: ``losses[:, t]`` predicts ``labels[:, t + 1]``.

        ``losses`` is ``(rows, length - 1)`` (the shifted cross-entropy), ``labels`` and ``sample_ids``
        the batch's (``sample_ids`` may be flattened, as for flash-attention); each loss goes to the
        source of the token it predicts, and tokens labelled ``-100`` (padding, each document's first
        token) are left out.
        """
        targets = labels[:, 1:]
        self.record_tokens(losses, sample_ids.reshape(labels.shape)[:, 1:], targets != -100)
