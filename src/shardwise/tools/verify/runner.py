"""Run the factory as every rank, in fresh processes, and gather what each rank yielded.

Phase one (processes with one ``PYTHONHASHSEED`` each): every rank's epochs under its own global
seeds (run A), the same again (A2), under other global seeds (B), a mid-epoch checkpoint, and on
rank 0 the probe of the ``set_epoch`` paths. Phase two (new processes, other ``PYTHONHASHSEED``):
every rank's epochs again (C), the resume from each rank's checkpoint, and the elastic resume at
another world size. Simulated mode spreads the ranks over a small pool of processes (rank ``r``
in process ``r % P``); ``spawn`` runs one process per rank in a real gloo group.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any

from .target import FactoryRef, TargetError
from .worker import Probe, RankRun, Saved, Setup, do_items

PHASE_HASH_SEEDS = (1, 101)
"""``PYTHONHASHSEED`` of phase one's and phase two's processes (plus the process number)."""


@dataclass
class Observed:
    """Everything one job's ranks yielded, ready for the checks."""

    label: str
    setup: Setup
    runs: dict[str, list[RankRun]]
    probe: Probe | None
    saved: list[Saved | None]
    resumed: dict[int, RankRun]
    elastic_world_size: int | None
    elastic: list[RankRun] | None
    error: str | None = None


def elastic_world_size(world_size: int) -> int:
    """The other world size an elastic resume is tried at: half the world, or 2 from a single process."""
    return world_size // 2 if world_size >= 2 else 2


PROCESSES_ENV = "SHARDWISE_VERIFY_PROCESSES"
"""Environment variable: processes per phase in simulated mode (default: the cores, at most 4)."""


def _pool_size() -> int:
    value = os.environ.get(PROCESSES_ENV, "")
    if value:
        try:
            size = int(value)
        except ValueError:
            size = 0
        if size < 1:
            raise ValueError(f"{PROCESSES_ENV} should be a positive integer, but got {PROCESSES_ENV}={value!r}")
        return size
    return min(os.cpu_count() or 1, 4)


def _pythonpath() -> str:
    # The children must import the factory's module exactly as this process does.
    return os.pathsep.join(os.path.abspath(p) if p else os.getcwd() for p in sys.path)


def _run_pool(
    payloads: list[list[tuple[FactoryRef, Setup, list[tuple[Any, ...]]]]], hash_seed: int, deadline: float
) -> list[list[dict[str, Any]]]:
    """Run each payload in its own fresh ``python -m shardwise.tools.verify`` process, all at once."""
    with tempfile.TemporaryDirectory(prefix="shardwise-verify-") as tmp:
        processes = []
        for number, payload in enumerate(payloads):
            path_in, path_out = os.path.join(tmp, f"in{number}"), os.path.join(tmp, f"out{number}")
            with open(path_in, "wb") as handle:
                pickle.dump(payload, handle, protocol=pickle.HIGHEST_PROTOCOL)
            env = dict(os.environ)
            env["PYTHONHASHSEED"] = str(hash_seed + number)
            env["PYTHONPATH"] = _pythonpath()
            env.setdefault("OMP_NUM_THREADS", "1")  # a pool of processes on few cores
            log = open(os.path.join(tmp, f"log{number}"), "wb")  # noqa: SIM115 (closed below)
            command = [sys.executable, "-m", "shardwise.tools.verify", path_in, path_out]
            processes.append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), log, path_out))
        try:
            for process, _, _ in processes:
                remaining = deadline - time.monotonic()
                try:
                    process.wait(timeout=max(remaining, 0.01))
                except subprocess.TimeoutExpired:
                    raise TimeoutError(
                        "verify passed its deadline: an epoch of the sampler did not end in time "
                        "(an endless sampler, or a collective waiting for peers); raise timeout= or --timeout"
                    ) from None
        finally:
            for process, log, _ in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
                log.close()
        results = []
        for number, (process, _, path_out) in enumerate(processes):
            if process.returncode != 0 or not os.path.exists(path_out):
                with open(os.path.join(tmp, f"log{number}"), "rb") as handle:
                    tail = handle.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"a verify process exited with code {process.returncode}:\n{tail}")
            with open(path_out, "rb") as handle:
                results.append(pickle.load(handle))
        return results


def _spawn_rank(rank: int, world_size: int, jobs: list[tuple[FactoryRef, Setup, list[tuple[Any, ...]]]]) -> Any:
    return [do_items(ref, setup, [i for i in items if i[1] % world_size == rank]) for ref, setup, items in jobs]


def _run_spawned(
    jobs: list[tuple[FactoryRef, Setup, list[tuple[Any, ...]]]], world_size: int, hash_seed: int, deadline: float
) -> list[list[dict[str, Any]]]:
    from ..launch import run_distributed

    previous = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = str(hash_seed)  # spawned interpreters read it when they start
    try:
        per_rank = run_distributed(
            _spawn_rank, world_size, jobs, timeout=max(deadline - time.monotonic(), 1.0)
        )
    finally:
        if previous is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = previous
    return [list(results) for results in per_rank]


def _merge(per_process: list[list[dict[str, Any]]], job: int) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for results in per_process:
        part = results[job]
        if "error" in part:
            if part["error"] == "target":
                raise TargetError(part["message"])
            return part
        merged.update(part)
    return merged


def observe(
    refs: list[FactoryRef], setups: list[Setup], *, spawn: bool, timeout: float, processes: int | None = None
) -> list[Observed]:
    """Run every job through both phases; one :class:`Observed` per job, in order."""
    deadline = time.monotonic() + timeout
    world_sizes = {s.world_size for s in setups}
    if spawn:
        setups = [replace(s, simulated=False) for s in setups]

    def run(items_of: list[list[tuple[Any, ...]]], phase: int) -> list[list[dict[str, Any]]]:
        jobs = list(zip(refs, setups, items_of, strict=False))
        if spawn:
            return _run_spawned(jobs, setups[0].world_size, PHASE_HASH_SEEDS[phase], deadline)
        pool = min(processes or _pool_size(), max(world_sizes))
        payloads = [
            [(ref, setup, [item for item in items if item[1] % pool == number]) for ref, setup, items in jobs]
            for number in range(pool)
        ]
        return _run_pool(payloads, PHASE_HASH_SEEDS[phase], deadline)

    if spawn and len(world_sizes) > 1:
        raise ValueError("spawn=True verifies jobs of one world size at a time")
    first = run([[("one", r, "probe" if spawn else "") for r in range(s.world_size)] for s in setups], 0)
    merged_first = [_merge(first, job) for job in range(len(setups))]
    second_items: list[list[tuple[Any, ...]]] = []
    for setup, got in zip(setups, merged_first, strict=False):
        items: list[tuple[Any, ...]] = []
        if "error" not in got:
            saved = [got.get(f"saved/{r}") for r in range(setup.world_size)]
            items = [("two", r, saved[r]) for r in range(setup.world_size)]
            probe: Probe = got["probe/0"]
            if probe.elastic and saved[0] is not None and saved[0].state is not None:
                other = elastic_world_size(setup.world_size)
                items += [("elastic", r, other, saved[0]) for r in range(other)]
        second_items.append(items)
    second = run(second_items, 1)
    observed = []
    for job, (ref, setup) in enumerate(zip(refs, setups, strict=False)):
        got = merged_first[job]
        if "error" in got:
            observed.append(Observed(ref.label, setup, {}, None, [], {}, None, None, error=got["message"]))
            continue
        got.update(_merge(second, job))
        if "error" in got:
            observed.append(Observed(ref.label, setup, {}, None, [], {}, None, None, error=got["message"]))
            continue
        world = range(setup.world_size)
        other = elastic_world_size(setup.world_size)
        elastic = [got[f"elastic/{r}"] for r in range(other)] if "elastic/0" in got else None
        observed.append(
            Observed(
                label=ref.label,
                setup=setup,
                runs={name: [got[f"{name}/{r}"] for r in world] for name in ("A", "A2", "B", "C")},
                probe=got["probe/0"],
                saved=[got.get(f"saved/{r}") for r in world],
                resumed={r: got[f"resumed/{r}"] for r in world if f"resumed/{r}" in got},
                elastic_world_size=other if elastic is not None else None,
                elastic=elastic,
            )
        )
    return observed
