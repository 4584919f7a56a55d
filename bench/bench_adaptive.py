"""Adaptive mixture weights (issue 31): the cost of an update at W=8, and a small model trained on 3 sources.

Run (alone on the machine)::

    python -m bench.bench_adaptive --plot adaptive_weights.png      # about 10 minutes on 2 CPU cores
    python -m bench.bench_adaptive --quick --plot weights.png  # under 2 minutes
    python -m bench.bench_adaptive --overhead-only              # the overhead tables and the memory row
    python -m bench.bench_adaptive --memory                     # the memory row alone (about a minute)
    python -m bench.bench_adaptive --arm exp3                   # one arm of the demonstration (about 3 minutes)

**Overhead.** 8 gloo ranks on this machine (CPU), side by side in one run: the update's collective
(one ``all_reduce`` of ``4 + 2 x 3`` int64 numbers with its checks) against the baseline, a bare
``all_reduce`` of one float (what DDP-style loops already pay per step), and a whole
``sampler.adaptive.update()``. In one process: the plan work of an update (policy, shares, ledger, the
plan's layout grown by one stretch), at the first updates and after 10^4, against the 1 ms target;
the state's size after 10^4 updates (``torch.save`` and JSON) against 1 MB; the private memory
(``RssAnon``) a process holds per update after 2.4e5 updates (a 1e9-sample epoch, an update every
4096), against the saved state's bytes per update. The update's ratio to the bare all_reduce is
printed for rank 0 and for the slowest rank, both from the same run: on 2 shared cores 8 ranks
wait for each other, so the ratio moves between runs; the absolute times say more.

**Demonstration.** A byte-level causal conv model (one embedding, one conv layer of width 6, 60k
parameters) learns next-byte prediction on 64-byte chunks of three sources of different
difficulty: WikiText-2 paragraphs (``--data``: valid split to train, test split held out), Python
stdlib source (``sysconfig.get_paths()['stdlib']``) and uniform random bytes (nothing to learn).
Three arms train the same number of bytes from the same initialisation: fixed uniform weights,
``Exp3`` and ``ExponentiatedGradient``. The policies are told each source's learning progress: by
how many percent its loss on a small dev split (48 chunks, apart from training and held-out data) fell over the
interval (the raw training loss would reward noise, whose loss is the highest and never falls).
Printed: the held-out loss per source (nats per byte) and the mean over the two real sources, and
the weight trajectories (a plot with matplotlib, else a CSV next to the path given).

**Kill and resume.** The ``ExponentiatedGradient`` arm again on 2 real gloo ranks, rank 1
SIGKILLed two steps after the checkpoint at the half, then resumed on 3 ranks. The ranks draw
their share of each global batch from the sampler and all-gather it; every rank trains an identical
replica on the gathered batch in plan order (a deterministic stand-in for DDP's gradient
all-reduce, whose float sums depend on W) and records the losses of its own samples. Printed: the
largest difference between the resumed ledger's weights and the uninterrupted single-process
run's, and the number of draws that differ (both 0 when the trajectory is reproduced exactly).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench._lib.common import STDLIB, add_data_argument, status_bytes, wikitext_paragraphs
from shardwise import AdaptiveWeights, Exp3, ExponentiatedGradient, MixtureSampler
from shardwise.tools.launch import run_distributed

CHUNK = 65  # 64 inputs and their next bytes
NAMES = ["wikitext", "stdlib", "noise"]
GLOBAL_BATCH = 48  # divisible by 1, 2 and 3 ranks
STEPS_PER_UPDATE = 8
INTERVAL = GLOBAL_BATCH * STEPS_PER_UPDATE
DEV = 48  # chunks a source whose loss, before and after each interval, the policies are told


# -- overhead -----------------------------------------------------------------------------------------
def _overhead_rank(rank: int, world_size: int, repeats: int) -> dict[str, float]:
    import torch.distributed as dist

    from shardwise.samplers.feedback import all_reduce_report

    torch.set_num_threads(1)
    sums, counts = np.arange(3, dtype=np.int64), np.ones(3, dtype=np.int64)
    one = torch.ones(1)
    timings: dict[str, list[float]] = {"baseline": [], "ten": [], "collective": [], "update": []}
    ten = torch.ones(10, dtype=torch.int64)
    for _ in range(20):  # warm the connections
        dist.all_reduce(one)
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(one)
        timings["baseline"].append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(ten)
        timings["ten"].append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        all_reduce_report(sums, counts, 7, 123)
        timings["collective"].append(time.perf_counter() - start)
    sampler = MixtureSampler([10**6] * 3, AdaptiveWeights(Exp3(), interval=512), num_samples=10**9, block=64, seed=0)
    adaptive = sampler.adaptive
    for update in range(1, repeats + 1):
        adaptive.record(np.ones(3), [0, 1, 2])
        dist.barrier()
        start = time.perf_counter()
        adaptive.update(position=update * 512)
        timings["update"].append(time.perf_counter() - start)
    return {key: statistics.median(values) * 1e6 for key, values in timings.items()}


def plan_work(updates: int) -> dict[str, float]:
    """One process: the time of ``update()`` without a collective, first 100 vs last 100 of ``updates``; state size."""
    sampler = MixtureSampler([10**6] * 3, AdaptiveWeights(Exp3(), interval=512), num_samples=10**10, block=64,
                             seed=0, num_replicas=1, rank=0)  # fmt: skip
    next(iter(sampler))  # the epoch's layout is cached: every update grows it (the worst case)
    adaptive = sampler.adaptive
    rng = np.random.default_rng(0)
    times = []
    for update in range(1, updates + 1):
        adaptive.record(rng.random(8) * 3, rng.integers(0, 3, 8))
        start = time.perf_counter()
        adaptive.update(position=update * 512)
        times.append(time.perf_counter() - start)
    state = sampler.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return {
        "first_us": statistics.median(times[:100]) * 1e6,
        "last_us": statistics.median(times[-100:]) * 1e6,
        "torch_save_bytes": float(len(buffer.getvalue())),
        "json_bytes": float(len(json.dumps(state))),
    }


def memory_per_update(updates: int) -> dict[str, float]:
    """Private memory (``RssAnon``) a process holds per update: ``updates`` updates of a 1e9-sample epoch, 3 sources.

    Every update lands in the epoch whose layout is cached (the worst case: the ledger, the plan's weight change and
    the layout's row all grow); measured in a fresh process (``python -m bench.bench_adaptive --memory``).
    """
    import gc

    interval = 4096
    sampler = MixtureSampler([10**6] * 3, AdaptiveWeights(Exp3(), interval=interval), num_samples=10**9, block=64,
                             seed=0, num_replicas=1, rank=0)  # fmt: skip
    next(iter(sampler))
    adaptive = sampler.adaptive
    values, sources = np.ones(3), np.arange(3)
    for update in range(1, 101):  # the first updates allocate what every later one reuses
        adaptive.record(values, sources)
        adaptive.update(position=update * interval)
    gc.collect()
    before = status_bytes("RssAnon")
    for update in range(101, updates + 101):
        adaptive.record(values, sources)
        adaptive.update(position=update * interval)
    gc.collect()
    after = status_bytes("RssAnon")
    buffer = io.BytesIO()
    torch.save(sampler.state_dict(), buffer)
    return {
        "rss_bytes": float(after - before),
        "per_update": (after - before) / updates,
        "state_per_update": len(buffer.getvalue()) / (updates + 100),
    }


# -- data and model -------------------------------------------------------------------------------------
def _chunks(data: bytes, count: int) -> np.ndarray:
    usable = min(count, len(data) // CHUNK)
    if usable < count:
        raise ValueError(f"only {usable} chunks of {CHUNK} bytes available, {count} needed")
    return np.frombuffer(data[: usable * CHUNK], dtype=np.uint8).reshape(usable, CHUNK).copy()


def load_sources(data_dir: Path, train: int, held: int) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """``(train, dev, held-out)`` chunks per source, ``(count, 65)`` uint8 each; dev (``DEV`` chunks): the policies'."""
    wiki_train = " ".join(" ".join(p) for p in wikitext_paragraphs("valid", data_dir)).encode()
    wiki_held = " ".join(" ".join(p) for p in wikitext_paragraphs("test", data_dir)).encode()
    code = bytearray()
    for path in sorted(STDLIB.glob("*.py")):
        code += path.read_bytes()
        if len(code) > (train + DEV + held) * CHUNK:
            break
    total = train + DEV + held
    noise = np.random.default_rng(0).integers(0, 256, total * CHUNK, dtype=np.uint8).tobytes()
    wiki, code_chunks, noise_chunks = (
        _chunks(wiki_train, train + DEV),
        _chunks(bytes(code), total),
        _chunks(noise, total),
    )
    trains = [wiki[:train], code_chunks[:train], noise_chunks[:train]]
    devs = [wiki[train:], code_chunks[train : train + DEV], noise_chunks[train : train + DEV]]
    helds = [_chunks(wiki_held, held), code_chunks[train + DEV :], noise_chunks[train + DEV :]]
    return trains, devs, helds


def unigram_entropy(chunks: np.ndarray) -> float:
    """Nats per byte of the source's byte frequencies: the loss of a model that ignores context."""
    counts = np.bincount(chunks[:, 1:].reshape(-1), minlength=256).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


class ByteModel(torch.nn.Module):
    """Next-byte logits from the 6 bytes before (a causal convolution over byte embeddings)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, 32)
        self.conv = torch.nn.Conv1d(32, 128, kernel_size=6)
        self.out = torch.nn.Linear(128, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.pad(self.embed(x).transpose(1, 2), (5, 0))
        return self.out(torch.relu(self.conv(h)).transpose(1, 2))


def per_sample_loss(model: torch.nn.Module, chunks: torch.Tensor) -> torch.Tensor:
    logits = model(chunks[:, :-1])
    tokens = torch.nn.functional.cross_entropy(logits.transpose(1, 2), chunks[:, 1:], reduction="none")
    return tokens.mean(dim=1)


def held_out(model: torch.nn.Module, helds: list[np.ndarray]) -> list[float]:
    with torch.no_grad():
        return [float(per_sample_loss(model, torch.from_numpy(h).long()).mean()) for h in helds]


# -- one training run (one process, or one rank of several) -------------------------------------------
def make_sampler(arm: str, sizes: list[int], steps: int) -> MixtureSampler:
    num_samples = steps * GLOBAL_BATCH
    if arm == "fixed":
        return MixtureSampler(sizes, [1, 1, 1], num_samples=num_samples, block=GLOBAL_BATCH, seed=0)
    policy = Exp3(smoothing=0.5, floor=0.05) if arm == "exp3" else ExponentiatedGradient(rate=0.05, smoothing=0.1,
                                                                                          floor=0.05)  # fmt: skip
    adaptive = AdaptiveWeights(policy, interval=INTERVAL)
    return MixtureSampler(sizes, adaptive, num_samples=num_samples, block=GLOBAL_BATCH, seed=0)


def train(arm: str, trains: list[np.ndarray], devs: list[np.ndarray], helds: list[np.ndarray], steps: int, *,
          folder: str | None = None,
          checkpoint_at: int | None = None, kill_at: int | None = None, resume: bool = False,
          eval_every: int = 0) -> dict[str, Any]:  # fmt: skip
    """Train one arm; with ``torch.distributed`` up, as one of its ranks (see the module docstring)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    distributed = dist.is_initialized()
    world, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)
    table = torch.from_numpy(np.concatenate(trains)).long()
    sampler = make_sampler(arm, [len(t) for t in trains], steps)
    if not distributed:
        sampler.num_replicas, sampler.rank = 1, 0
    torch.manual_seed(0)
    model = ByteModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    step = 0
    if resume and folder is not None:
        saved = torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        sampler.load_state_dict(saved["sampler"])
        step = saved["step"]
    previous = held_out(model, devs)  # the dev losses at the last update (a checkpoint is taken at one)
    drawn: list[list[int]] = []
    curve: list[tuple[int, list[float]]] = []
    per_rank = GLOBAL_BATCH // world
    iterator = iter(torch.utils.data.DataLoader(range(sum(len(t) for t in trains)), batch_size=per_rank,
                                                sampler=sampler))  # fmt: skip
    log = open(os.path.join(folder, f"drawn-{world}-{rank}.jsonl"), "a") if folder is not None else None  # noqa: SIM115
    while step < steps:
        if kill_at is not None and step == kill_at and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        local = next(iterator)
        if distributed:
            gathered = [torch.empty_like(local) for _ in range(world)]
            dist.all_gather(gathered, local)
            batch = torch.stack(gathered, dim=1).reshape(-1)  # plan order: position start + r + W * k
        else:
            batch = local
        losses = per_sample_loss(model, table[batch])
        optimizer.zero_grad()
        losses.mean().backward()
        optimizer.step()
        step += 1
        drawn.append(batch.tolist())
        if log is not None and rank == 0:
            log.write(json.dumps([step, batch.tolist()]) + "\n")
            log.flush()
        if sampler.adaptive is not None and sampler.adaptive.update_due():
            # Learning progress: by how many percent each source's dev loss fell over the interval. Every rank has the
            # same replica and reports the same three values, so the means are the values themselves.
            now = held_out(model, devs)
            sampler.adaptive.record(100.0 * (1.0 - np.divide(now, previous)), [0, 1, 2])  # percent of the dev loss
            sampler.adaptive.update()
            previous = now
        if eval_every and step % eval_every == 0:
            curve.append((step, held_out(model, helds)))
        if checkpoint_at is not None and step == checkpoint_at and rank == 0 and folder is not None:
            temporary = os.path.join(folder, "checkpoint.tmp")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "sampler": sampler.state_dict(), "step": step}, temporary)  # fmt: skip
            os.replace(temporary, os.path.join(folder, "checkpoint.pt"))
    if log is not None:
        log.close()
    ledger = sampler.adaptive.ledger.weights.tolist() if sampler.adaptive is not None else [[1 / 3] * 3]
    if folder is not None and rank == 0:
        with open(os.path.join(folder, f"ledger-{world}.json"), "w") as handle:
            json.dump(ledger, handle)
    return {"held_out": held_out(model, helds), "ledger": ledger, "drawn": drawn, "curve": curve}


def _rank_train(rank: int, world_size: int, arm: str, sources: Any, steps: int, folder: str,
                checkpoint_at: int | None, kill_at: int | None, resume: bool) -> None:  # fmt: skip
    train(arm, *sources, steps, folder=folder, checkpoint_at=checkpoint_at, kill_at=kill_at, resume=resume)


def _drawn_file(folder: str, world: int) -> dict[int, list[int]]:
    with open(os.path.join(folder, f"drawn-{world}-0.jsonl")) as handle:
        return {step: batch for step, batch in map(json.loads, handle)}


def write_trajectories(path: Path, results: dict[str, dict[str, Any]]) -> str:
    """The weight trajectories (and the held-out curves) as a PNG, or as CSV when matplotlib is missing."""
    rows = [(arm, update * INTERVAL * (CHUNK - 1), weights) for arm in ("exp3", "eg")
            for update, weights in enumerate(results[arm]["ledger"])]  # fmt: skip
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        csv = path.with_suffix(".csv")
        with open(csv, "w") as handle:
            handle.write("arm,bytes,wikitext,stdlib,noise\n")
            for arm, tokens, weights in rows:
                handle.write(f"{arm},{tokens}," + ",".join(f"{w:.6f}" for w in weights) + "\n")
        return f"matplotlib is not installed: wrote the trajectories as CSV to {csv}"
    figure, axes = plt.subplots(1, 3, figsize=(15, 4))
    for axis, arm, title in ((axes[0], "exp3", "Exp3 weights"), (axes[1], "eg", "ExponentiatedGradient weights")):
        ledger = np.asarray(results[arm]["ledger"])
        x = np.arange(len(ledger)) * INTERVAL * (CHUNK - 1) / 1e6
        for i, name in enumerate(NAMES):
            axis.step(x, ledger[:, i], where="post", label=name)
        axis.set(title=title, xlabel="bytes trained (millions)", ylabel="weight", ylim=(0, 1))
        axis.legend()
    for arm, style in (("fixed", ":"), ("exp3", "--"), ("eg", "-")):
        curve = results[arm]["curve"]
        x = [s * GLOBAL_BATCH * (CHUNK - 1) / 1e6 for s, _ in curve]
        axes[2].plot(x, [np.mean(v[:2]) for _, v in curve], style, label=arm)
    axes[2].set(title="held-out loss, mean of wikitext and stdlib", xlabel="bytes trained (millions)",
                ylabel="nats per byte")  # fmt: skip
    axes[2].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return f"wrote the weight trajectories to {path}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_argument(parser)
    parser.add_argument("--plot", type=Path, default=Path("adaptive_weights.png"), help="where the plot goes")
    parser.add_argument("--quick", action="store_true", help="a smaller run (under 2 minutes)")
    parser.add_argument("--skip-overhead", action="store_true", help="only the demonstration")
    parser.add_argument("--overhead-only", action="store_true", help="only the overhead tables (no demonstration)")
    parser.add_argument("--memory", action="store_true", help="only the private memory an update holds")
    parser.add_argument("--arm", choices=["fixed", "exp3", "eg"], help="only this arm of the demonstration")
    options = parser.parse_args()
    steps = 160 if options.quick else 1200
    updates = 2_000 if options.quick else 10_000
    repeats = 100 if options.quick else 400
    memory_updates = 20_000 if options.quick else 240_000

    if options.memory:
        print_memory(memory_updates)
        return
    if options.arm:
        one_arm(options, steps)
        return
    if not options.skip_overhead:
        overhead(repeats, updates)
        print_memory(memory_updates)
    if not options.overhead_only:
        demonstration(options, steps)


def print_memory(updates: int) -> None:
    """The private memory a process holds per update, against the saved state's bytes per update."""
    found = memory_per_update(updates)
    print(f"\n== private memory (RssAnon) after {updates} updates of a 1e9-sample epoch, 3 sources, layout cached")
    print("| RssAnon grown | per update | saved state (torch.save) per update |")
    print("|---|---|---|")
    print(f"| {found['rss_bytes'] / 1e6:.1f} MB | {found['per_update']:.0f} bytes | "
          f"{found['state_per_update']:.1f} bytes |")  # fmt: skip


def overhead(repeats: int, updates: int) -> None:
    """The first two tables: the collective at W=8 against a bare all_reduce, the plan work and the state size."""
    print(f"== overhead of an update: 8 gloo ranks on CPU, median of {repeats} (microseconds; rank 0 / slowest)")
    per_rank = run_distributed(_overhead_rank, 8, repeats, timeout=300)
    baseline = per_rank[0]["baseline"]
    slowest_baseline = max(r["baseline"] for r in per_rank)
    print("| what | rank 0 | slowest rank | x bare all_reduce (rank 0 / slowest) |")
    print("|---|---|---|---|")
    for key, label in (("baseline", "all_reduce of 1 float (baseline)"), ("ten", "all_reduce of 10 int64"),
                       ("collective", "the update's collective (10 int64, checks)"),
                       ("update", "sampler.adaptive.update() (collective + plan work)")):  # fmt: skip
        slowest = max(r[key] for r in per_rank)
        print(f"| {label} | {per_rank[0][key]:.0f} | {slowest:.0f} | {per_rank[0][key] / baseline:.2f} / "
              f"{slowest / slowest_baseline:.2f} |")  # fmt: skip
    work = plan_work(updates)
    print(f"\n== plan work of an update, one process (target <= 1000 us), and the state after {updates} updates")
    print(f"| updates 1-100 | updates {updates - 99}-{updates} | state, torch.save | state, JSON | target |")
    print("|---|---|---|---|---|")
    print(f"| {work['first_us']:.0f} us | {work['last_us']:.0f} us | {work['torch_save_bytes'] / 1e6:.3f} MB | "
          f"{work['json_bytes'] / 1e6:.3f} MB | <= 1 MB |")  # fmt: skip


def one_arm(options: argparse.Namespace, steps: int) -> None:
    """One arm of the demonstration (its held-out losses, final weights and curve), without the plot or the kill."""
    train_count, held_count = (600, 120) if options.quick else (4_000, 400)
    trains, devs, helds = load_sources(options.data, train_count, held_count)
    result = train(options.arm, trains, devs, helds, steps, eval_every=max(1, steps // 10))
    held = result["held_out"]
    print(f"| {options.arm} | wikitext {held[0]:.3f} | stdlib {held[1]:.3f} | noise {held[2]:.3f} | "
          f"mean of the two {np.mean(held[:2]):.3f} | final weights "
          f"{', '.join(f'{w:.2f}' for w in result['ledger'][-1])} |")  # fmt: skip
    print("curve:", ", ".join(f"{step}: {np.mean(v[:2]):.3f}" for step, v in result["curve"]))


def demonstration(options: argparse.Namespace, steps: int) -> None:
    """The fixed and adaptive arms, the plot, and the kill-and-resume check."""
    train_count, held_count = (600, 120) if options.quick else (4_000, 400)
    trains, devs, helds = load_sources(options.data, train_count, held_count)
    total = steps * GLOBAL_BATCH * 64 / 1e6
    print(f"\n== demonstration: {steps} steps of {GLOBAL_BATCH} chunks of 64 bytes ({total:.2f}M bytes), an update "
          f"every {STEPS_PER_UPDATE} steps; held-out nats per byte")  # fmt: skip
    print("unigram entropy (a model without context):",
          ", ".join(f"{n} {unigram_entropy(t):.3f}" for n, t in zip(NAMES, trains, strict=True)))  # fmt: skip
    results: dict[str, dict[str, Any]] = {}
    eval_every = max(1, steps // 10)
    for arm in ("fixed", "exp3", "eg"):
        start = time.perf_counter()
        results[arm] = train(arm, trains, devs, helds, steps, eval_every=eval_every)
        results[arm]["seconds"] = time.perf_counter() - start
    fixed_mean = float(np.mean(results["fixed"]["held_out"][:2]))
    print("| arm | wikitext | stdlib | noise | mean of wikitext, stdlib | vs fixed | final weights | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for arm, label in (("fixed", "fixed 1/3 each"), ("exp3", "Exp3"), ("eg", "ExponentiatedGradient")):
        held = results[arm]["held_out"]
        mean = float(np.mean(held[:2]))
        weights = ", ".join(f"{w:.2f}" for w in results[arm]["ledger"][-1])
        print(f"| {label} | {held[0]:.3f} | {held[1]:.3f} | {held[2]:.3f} | {mean:.3f} | {mean / fixed_mean:.3f} | "
              f"{weights} | {results[arm]['seconds']:.1f} |")  # fmt: skip
    curve_points = [step for step, _ in results["fixed"]["curve"]]
    print("\nheld-out loss, mean of wikitext and stdlib, as training goes (millions of bytes trained):")
    print("| arm | " + " | ".join(f"{step * GLOBAL_BATCH * 64 / 1e6:.2f}" for step in curve_points) + " |")
    print("|---|" + "---|" * len(curve_points))
    for arm in ("fixed", "exp3", "eg"):
        print(f"| {arm} | " + " | ".join(f"{np.mean(v[:2]):.3f}" for _, v in results[arm]["curve"]) + " |")
    print(write_trajectories(options.plot, results))

    half = (steps // 2) // STEPS_PER_UPDATE * STEPS_PER_UPDATE
    print(f"\n== kill and resume: ExponentiatedGradient on 2 gloo ranks, checkpoint at step {half}, rank 1 SIGKILLed "
          f"at step {half + 2}, resumed on 3 ranks")  # fmt: skip
    folder = tempfile.mkdtemp(prefix="shardwise-adaptive-")
    try:
        run_distributed(_rank_train, 2, "eg", (trains, devs, helds), steps, folder, half, half + 2, False,
                        timeout=600)  # fmt: skip
    except RuntimeError as error:
        print("job at W=2 died as planned:", str(error).splitlines()[1][:80])
    run_distributed(_rank_train, 3, "eg", (trains, devs, helds), steps, folder, None, None, True, timeout=600)
    with open(os.path.join(folder, "ledger-3.json")) as handle:
        resumed = np.asarray(json.load(handle))
    reference = np.asarray(results["eg"]["ledger"])
    head, tail = _drawn_file(folder, 2), _drawn_file(folder, 3)
    drawn = [head[s] for s in range(1, half + 1)] + [tail[s] for s in range(half + 1, steps + 1)]
    differing = sum(
        a != b for x, y in zip(drawn, results["eg"]["drawn"], strict=True) for a, b in zip(x, y, strict=True)
    )
    print("| updates (resumed / uninterrupted) | max weight difference | draws that differ (of all) |")
    print("|---|---|---|")
    same_shape = resumed.shape == reference.shape
    difference = float(np.abs(resumed - reference).max()) if same_shape else float("nan")
    print(f"| {len(resumed) - 1} / {len(reference) - 1} | {difference:.3g} | {differing} of {steps * GLOBAL_BATCH} |")
    if not same_shape or difference or differing:
        sys.exit("the resumed run did not reproduce the uninterrupted trajectory")


if __name__ == "__main__":
    main()
