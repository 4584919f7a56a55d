"""The adaptive mixture core: shares, fixed-point statistics, the ledger, the policies (pure numpy)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise._core.adaptive import (
    SHARE_DENOMINATOR,
    SourceStatistics,
    WeightLedger,
    fixed_point_sums,
    min_share_for,
    quantize_shares,
)
from shardwise._core.adaptive_policies import AdaptiveWeights, Exp3, ExponentiatedGradient, PolicyStep, run_policy
from shardwise._core.errors import MalformedStateError
from shardwise._core.mixture import MixturePlan, MixtureStop, PendingWeightsError
from shardwise._core.weights import Weights, WeightSchedule, exact_weights


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=8).filter(lambda w: sum(w) > 0),
       st.sampled_from([1, 16, 1000]))  # fmt: skip
def test_shares_sum_to_the_denominator_and_keep_every_positive_weight_in_a_block(
    weights: list[float], block: int
) -> None:
    """quantize_shares: exact sum, zero stays zero, a positive weight gets >= 1/block when that fits."""
    array = np.asarray(weights)
    if (array > 0).sum() * min_share_for(block) > SHARE_DENOMINATOR:
        return
    shares = quantize_shares(array, min_share_for(block))
    assert int(shares.sum()) == SHARE_DENOMINATOR
    assert ((shares == 0) == (array == 0)).all()
    assert (shares[array > 0] * block >= SHARE_DENOMINATOR).all()
    if block == 1:  # no lift: within one share of the exact value
        assert np.abs(shares - array / array.sum() * SHARE_DENOMINATOR).max() <= 1


def test_fixed_point_sums_do_not_depend_on_how_samples_are_split() -> None:
    """NOTE [ Reported statistics are fixed-point ]: any split over ranks sums to the same integers."""
    rng = np.random.default_rng(0)
    values, sources = rng.random(1000) * 10, rng.integers(0, 3, 1000)
    whole = fixed_point_sums(values, sources, 3)
    for parts in (2, 3, 7):
        pieces = [fixed_point_sums(v, s, 3) for v, s in zip(np.array_split(values, parts), np.array_split(sources, parts),
                                                             strict=True)]  # fmt: skip
        assert (sum(p[0] for p in pieces) == whole[0]).all() and (sum(p[1] for p in pieces) == whole[1]).all()
    means = SourceStatistics.from_sums(1, *whole).means
    exact = [values[sources == i].mean() for i in range(3)]
    assert np.allclose(means, exact, atol=2**-16)


def test_ledger_positions_growth_and_state_round_trip() -> None:
    """Entry u is in force from (u + 1) * interval; the table grows; to_state/from_state give the same ledger."""
    ledger = WeightLedger(100, quantize_shares(np.ones(3)), np.zeros(3))
    assert (ledger.due_at, ledger.known_until, ledger.entry_at(199), ledger.entry_at(200)) == (100, 200, 0, 0)
    for u in range(1, 21):
        ledger.append(quantize_shares(np.asarray([u, 1.0, 2.0])), np.full(3, float(u)))
    assert ledger.updates == 20 and ledger.shares.shape == (21, 3)
    assert (ledger.start_of(0), ledger.start_of(1), ledger.start_of(20), ledger.known_until) == (0, 200, 2100, 2200)
    assert ledger.entry_at(2099) == 19 and ledger.entry_at(10**9) == 20
    loaded = WeightLedger.from_state(ledger.to_state(), 100, 3)
    assert (loaded.shares == ledger.shares).all() and (loaded.state == ledger.state).all()
    assert np.allclose(ledger.weights.sum(axis=1), 1.0)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s.pop("shares"), "keys"),
        (lambda s: s.update(interval=5), "interval"),
        (lambda s: s.update(shares=[1, 2]), "malformed"),
        (lambda s: s.update(shares=[SHARE_DENOMINATOR, 0, 1] * 2), "summing"),
    ],
)
def test_a_malformed_ledger_state_names_what_is_wrong(change: object, match: str) -> None:
    """A ledger state edited or from another sampler is a MalformedStateError."""
    state = WeightLedger(100, quantize_shares(np.ones(3)), np.zeros(3)).to_state()
    state["updates"] = 1
    state["shares"] = state["shares"] * 2
    change(state)  # type: ignore[operator]
    with pytest.raises(MalformedStateError, match=match):
        WeightLedger.from_state(state, 100, 3)


def _step(policy: object, ledger: WeightLedger, means: list[float], counts: list[int]) -> np.ndarray:
    update = ledger.updates + 1
    drawn = ledger.drawn((update - 1) * ledger.interval, update * ledger.interval, 0, 1)
    statistics = SourceStatistics(update, np.asarray(means, dtype=np.float64), np.asarray(counts), drawn)
    step = run_policy(policy, ledger, statistics)  # type: ignore[arg-type]
    ledger.append(quantize_shares(step.weights), step.state)
    return step.weights / step.weights.sum()


@pytest.mark.parametrize("policy", [Exp3(floor=0.05), ExponentiatedGradient(rate=2.0, smoothing=0.2, floor=0.05)])
def test_policies_move_weight_to_the_higher_loss_and_keep_the_floor(policy: object) -> None:
    """Both built-in policies raise the weight of the source with the higher loss and never go below the floor."""
    initial = np.full(3, 1 / 3)
    ledger = WeightLedger(10, quantize_shares(initial), policy.initial_state(initial))  # type: ignore[attr-defined]
    for _ in range(30):
        weights = _step(policy, ledger, [3.0, 1.0, 0.5], [10, 10, 10])
    assert weights.argmax() == 0 and weights.min() >= 0.05 - 1e-12
    again = WeightLedger(10, quantize_shares(initial), policy.initial_state(initial))  # type: ignore[attr-defined]
    for _ in range(30):
        _step(policy, again, [3.0, 1.0, 0.5], [10, 10, 10])
    assert (again.shares == ledger.shares).all() and (again.state == ledger.state).all()  # pure: same bits


def test_a_source_without_samples_keeps_its_estimate() -> None:
    """A source with no samples in an interval (NaN mean) does not move the policy's state for it."""
    policy = ExponentiatedGradient(rate=1.0, smoothing=0.0, floor=0.0)
    ledger = WeightLedger(10, quantize_shares(np.ones(2)), policy.initial_state(np.full(2, 0.5)))
    _step(policy, ledger, [1.0, float("nan")], [4, 0])
    assert np.isfinite(ledger.state).all()
    assert ledger.state[0] - ledger.state[1] == pytest.approx(1.0)


def test_exp3_exploration_decays_to_the_floor() -> None:
    """EXP3's exploration starts at 1/S and decays as sqrt(ln S / (S t)), never below the floor."""
    policy = Exp3(smoothing=0.0, floor=0.01)
    ledger = WeightLedger(10, quantize_shares(np.ones(4)), policy.initial_state(np.ones(4)))
    weights = [_step(policy, ledger, [1e4, 0.0, 0.0, 0.0], [1, 1, 1, 1]) for _ in range(400)]
    assert weights[0].min() > weights[-1].min() >= 0.01 - 1e-12
    assert weights[-1].min() == pytest.approx(max(0.01, np.sqrt(np.log(4) / (4 * 400))), rel=1e-6)


def test_a_user_policy_is_a_function_of_the_ledger_and_the_statistics() -> None:
    """The protocol: any callable (ledger, statistics) -> weights or PolicyStep; bad weights name the policy."""

    def follow_loss(ledger: WeightLedger, statistics: SourceStatistics) -> np.ndarray:
        return np.nan_to_num(statistics.means, nan=0.0) + ledger.weights[-1]

    ledger = WeightLedger(10, quantize_shares(np.ones(2)), np.zeros(0))
    assert _step(follow_loss, ledger, [1.0, 0.0], [1, 1]) == pytest.approx([0.75, 0.25])
    with_state = run_policy(lambda ledger, s: PolicyStep(np.ones(2), np.ones(5)), ledger, SourceStatistics(
        2, np.zeros(2), np.ones(2, dtype=np.int64)))  # fmt: skip
    assert with_state.state.tolist() == [1.0] * 5

    def negative(ledger: WeightLedger, statistics: SourceStatistics) -> list[float]:
        return [-1.0, 1.0]

    with pytest.raises(ValueError, match=r"negative.*update 2"):
        run_policy(negative, ledger, SourceStatistics(2, np.zeros(2), np.ones(2, dtype=np.int64)))


def test_adaptive_weights_fingerprint_names_the_policy_configuration() -> None:
    """The fingerprint differs with the policy's parameters, the interval and the initial weights."""
    base = AdaptiveWeights(Exp3(), interval=64).fingerprint()
    assert base["policy"] == "Exp3" and base["interval"] == 64
    others = [
        AdaptiveWeights(Exp3(floor=0.03), interval=64),
        AdaptiveWeights(Exp3(), interval=128),
        AdaptiveWeights(Exp3(), interval=64, initial=[1, 2]),
        AdaptiveWeights(ExponentiatedGradient(), interval=64),
    ]
    assert all(other.fingerprint() != base for other in others)  # fmt: skip


def test_an_extended_plan_equals_the_schedule_with_the_same_changes() -> None:
    """MixturePlan.extend (one stretch an update, the cached layout grown) draws what a by_samples schedule draws."""
    sizes, changes = np.asarray([50, 30, 7]), {0: [1.0, 1.0, 1.0], 200: [0.5, 0.25, 0.25], 300: [0.1, 0.6, 0.3],
                                               1100: [0.3, 0.3, 0.4]}  # fmt: skip
    grown = MixturePlan(sizes, WeightSchedule.constant([1, 1, 1]), stop=MixtureStop.NUM_SAMPLES, num_samples=1000,
                        primary=None, block=20, shuffle=True)  # fmt: skip
    grown.layout(0)  # cached: extend grows it
    for threshold, weights in list(changes.items())[1:]:
        grown.extend(threshold, Weights(*exact_weights(np.asarray(weights))), threshold + 100)
    scheduled = MixturePlan(sizes, WeightSchedule.by_samples(changes), stop=MixtureStop.NUM_SAMPLES, num_samples=1000,
                            primary=None, block=20, shuffle=True)  # fmt: skip
    with pytest.raises(PendingWeightsError, match="run position 1200"):
        grown.indices(3, 1, np.arange(1000))
    assert (grown.known_prefix(1, np.arange(1000)) == np.arange(200)).all()
    grown.known_until = None
    for epoch in (0, 1):
        assert (grown.indices(3, epoch, np.arange(1000)) == scheduled.indices(3, epoch, np.arange(1000))).all()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 7), st.integers(1, 5), st.integers(1, 4), st.integers(0, 2), st.integers(0, 3))
def test_drawn_weights_are_the_plans_weights_averaged_over_the_interval(
    interval_blocks: int, block: int, epoch_blocks: int, lag: int, cut: int
) -> None:
    """NOTE [ The weights that drew an interval ]: ledger.drawn equals the plan's weights in force, position by position.

    Intervals that are not a multiple of the block, and epochs that are not, move the changes to block boundaries.
    """
    interval, num_samples = interval_blocks * 3 + cut, epoch_blocks * block * 2 + cut
    rng = np.random.default_rng(interval * 1000 + block * 10 + lag)
    ledger = WeightLedger(interval, quantize_shares(np.ones(3)), np.zeros(0), lag)
    plan = MixturePlan(np.asarray([5, 7, 3]), WeightSchedule.constant([1, 1, 1]), stop=MixtureStop.NUM_SAMPLES,
                       num_samples=num_samples, primary=None, block=block * 3 + 1, shuffle=True)  # fmt: skip
    for _ in range(8):
        ledger.append(quantize_shares(rng.random(3) + 0.5, min_share_for(plan.block)), np.zeros(0))
        plan.extend(ledger.start_of(ledger.updates), Weights(tuple(ledger.shares[-1].tolist()), SHARE_DENOMINATOR),
                    ledger.known_until)  # fmt: skip
    for update in range(1, 9):
        first, stop = (update - 1) * interval, update * interval
        expected = np.mean([plan.weights_at(p // num_samples, p % num_samples) for p in range(first, stop)], axis=0)
        # atol: the plan draws entry 0 with exact thirds, the ledger holds them as shares of 2**30
        assert np.allclose(ledger.drawn(first, stop, num_samples, plan.block), expected, rtol=0, atol=1e-8)


def test_exp3_divides_by_the_drawn_weights_not_the_last_update() -> None:
    """At lag 1 the interval update t reports was drawn with entry t - 2, not ledger.latest (entry t - 1)."""
    policy = Exp3(smoothing=0.5, floor=0.0)
    ledger = WeightLedger(10, quantize_shares(np.ones(3)), policy.initial_state(np.ones(3)))
    ledger.append(quantize_shares(np.asarray([0.2, 0.3, 0.5])), np.zeros(3))  # update 1, in force from 20
    ledger.append(quantize_shares(np.asarray([0.6, 0.3, 0.1])), np.zeros(3))  # update 2, in force from 30
    means = np.asarray([1.0, 2.0, 3.0])
    drawn = ledger.drawn(20, 30, 0, 1)  # update 3 reports [20, 30): entry 1's weights
    assert drawn == pytest.approx([0.2, 0.3, 0.5], abs=1e-9)
    step = run_policy(policy, ledger, SourceStatistics(3, means, np.ones(3, dtype=np.int64), drawn))
    assert step.state == pytest.approx(0.5 * means / drawn, rel=1e-12)
    with pytest.raises(ValueError, match=r"statistics\.drawn"):
        run_policy(policy, ledger, SourceStatistics(3, means, np.ones(3, dtype=np.int64)))
