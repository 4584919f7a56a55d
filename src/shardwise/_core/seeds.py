"""Seed derivation: every random choice is a pure function of ``(seed, epoch, purpose, ...)``.

Sub-seeds are derived by hashing with :class:`numpy.random.SeedSequence`, never by adding:
``seed + epoch`` would make seed 0 at epoch 1 equal seed 1 at epoch 0. SeedSequence's mixing
algorithm is part of numpy's stability promise, so a derived seed is the same on every platform,
process and numpy release.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from collections.abc import Mapping

import numpy as np

from .errors import check_int

logger = logging.getLogger("shardwise")

SEED_ENV = "SHARDWISE_SEED"
"""Environment variable that fixes ``seed=None`` to a given integer on every rank."""

# Variables a launcher sets to the same value on every rank of one job (never per-rank ones).
JOB_ENV = (
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "LSB_JOBID",
    "PBS_JOBID",
    "MASTER_ADDR",
    "MASTER_PORT",
)

SEED_MAX = 2**64 - 1
"""The largest seed (seeds are 64-bit words)."""
INDEX_SHUFFLE = "shuffle"
"""Seed path label of the index permutation, shared by ``ShardedSampler`` and ``ScheduledBatchSampler``."""


def _path_word(part: int | str) -> int:
    if isinstance(part, str):
        # A stable 64-bit word per purpose name: Python's hash() is salted per process.
        return int.from_bytes(hashlib.blake2b(part.encode(), digest_size=8).digest(), "little")
    return check_int("seed path element", part, minimum=0)


def derive_seed(seed: int, *path: int | str) -> int:
    """A 64-bit seed derived from ``seed`` and a path such as ``(epoch, "shuffle")``.

    Distinct paths give independent seeds; the same path always gives the same seed.
    """
    sequence = np.random.SeedSequence(entropy=seed, spawn_key=tuple(_path_word(p) for p in path))
    return int(sequence.generate_state(1, dtype=np.uint64)[0])


def derive_words(seed: int, *path: int | str, count: int) -> np.ndarray:
    """``count`` independent 64-bit words for one path, e.g. the round keys of a permutation."""
    sequence = np.random.SeedSequence(entropy=seed, spawn_key=tuple(_path_word(p) for p in path))
    return sequence.generate_state(count, dtype=np.uint64)


def check_seed(seed: object) -> int | None:
    """Validate a user's ``seed`` argument: ``None`` or an integer in ``[0, 2**64)``."""
    if seed is None:
        return None
    return check_int("seed", seed, minimum=0, maximum=SEED_MAX)


def resolve_seed(seed: int | None, *, world_size: int, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Turn ``seed=None`` into one integer that every rank of the job computes alike.

    Resolution order, with no communication between ranks:

    1. an explicit integer ``seed`` is returned as is;
    2. ``SHARDWISE_SEED`` in the environment;
    3. a hash of the job identity the launcher gives every rank alike (torchrun's
       ``TORCHELASTIC_RUN_ID``, SLURM's job and step ids, ``MASTER_ADDR``/``MASTER_PORT``, ...):
       a new job draws a new seed, and every rank of a job draws the same one;
    4. a single process (``world_size == 1``) draws a fresh random seed;
    5. otherwise this raises: a per-process random seed would silently overlap shards.

    Returns:
        The seed and a short description of where it came from, for logs and ``describe()``.

    Raises:
        ValueError: when ``seed=None`` cannot be resolved identically on every rank.
    """
    if seed is not None:
        return seed, "argument"
    env = os.environ if env is None else env
    if SEED_ENV in env:
        try:
            value = int(env[SEED_ENV])
        except ValueError:
            raise ValueError(
                f"{SEED_ENV} should be a non-negative integer, but got {SEED_ENV}={env[SEED_ENV]!r}"
            ) from None
        return check_int(SEED_ENV, value, minimum=0, maximum=SEED_MAX), SEED_ENV
    parts = [f"{name}={env[name]}" for name in JOB_ENV if name in env]
    if parts:
        digest = hashlib.blake2b("|".join(parts).encode(), digest_size=8).digest()
        source = "job identity (" + ", ".join(name for name in JOB_ENV if name in env) + ")"
        return int.from_bytes(digest, "little") >> 1, source
    if world_size == 1:
        return secrets.randbits(63), "random (single process)"
    raise ValueError(
        f"seed=None cannot be resolved identically on all {world_size} ranks: no launcher job id "
        f"({', '.join(JOB_ENV)}) is set. Pass seed=<int>, or set {SEED_ENV} to the same integer "
        "on every rank."
    )


def log_resolved_seed(owner: str, seed: int, source: str) -> None:
    """Record a resolved seed once, so a run can be reproduced by passing it back."""
    logger.info("%s: seed=None resolved to seed=%d from %s", owner, seed, source)
