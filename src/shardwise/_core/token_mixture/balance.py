"""A group of a packed mixture's batches dealt for equal attention cost, each batch keeping its exact token quotas.

Batch ``j`` must hold exactly ``q_i(j)`` tokens of source ``i`` (:mod:`.quotas`); which documents
make up those tokens is free within a **group** of consecutive batches. The group's pieces of each
source (its stream range for the group, :mod:`.streams`) are dealt longest first, each to the batch
of the group whose attention cost so far (the sum of its pieces' squared lengths) is lowest and that
still has room for the source; a piece larger than that room fills it and its rest is dealt on. So
every batch of a group ends near the group's mean cost, and so does every step of any ``W``
consecutive batches within it: the cost of the slowest rank follows, not only its tokens.

Deterministic (integer costs, ties to the lower batch), O(pieces x log group) per group, computed
once per group by each rank that reads it (a rank reads ``group / W`` of a group's batches).
"""

from __future__ import annotations

import heapq

import numpy as np


def deal_group(
    sources: list[tuple[np.ndarray, np.ndarray, np.ndarray]], quotas: np.ndarray, max_len: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each batch's ``(ids, starts, stops)``: the sources' pieces dealt into batches of exact quotas.

    Args:
        sources: per source, its pieces for the whole group in stream order (``ids, starts, stops``).
        quotas: ``(batches, sources)`` tokens each batch holds of each source; a source's column sums
            to its pieces' tokens.
        max_len: a row's tokens: a piece longer than a row is cut into rows, so it costs its rows'
            squares (``(L // max_len) * max_len**2 + (L % max_len)**2``), not ``L**2``.

    Example:
        >>> out = deal_group([(np.array([1, 2]), np.array([0, 0]), np.array([6, 2]))], np.array([[4], [4]]), 8)
        >>> [(b[0].tolist(), (b[2] - b[1]).tolist()) for b in out]
        [([1], [4]), ([1, 2], [2, 2])]
    """
    batches = quotas.shape[0]
    costs = [0] * batches
    dealt: list[list[tuple[int, int, int]]] = [[] for _ in range(batches)]
    rooms, heaps, pieces = [], [], []
    for source, (ids, starts, stops) in enumerate(sources):
        room = [int(q) for q in quotas[:, source]]
        held = int((stops - starts).sum())
        if sum(room) != held:
            raise ValueError(f"source {source}'s pieces hold {held} tokens, but its quotas add up to {sum(room)}")
        rooms.append(room)
        heaps.append([(0, j) for j in range(batches) if room[j]])  # (cost when pushed, batch): one per batch
        spans = zip(ids.tolist(), starts.tolist(), stops.tolist(), strict=True)
        pieces += [(first - last, source, k, i, first, last) for k, (i, first, last) in enumerate(spans)]
    pieces.sort()  # longest first across sources; ties by source, then stream order
    for _, source, _, identity, first, stop in pieces:
        room, heap, start = rooms[source], heaps[source], first
        while start < stop:
            cost, j = heapq.heappop(heap)
            if cost != costs[j]:  # pushed before another source's piece went to batch j: its cost has grown
                heapq.heappush(heap, (costs[j], j))
                continue
            take = min(stop - start, room[j])
            dealt[j].append((identity, start, start + take))
            costs[j] += take // max_len * max_len * max_len + (take % max_len) ** 2
            room[j] -= take
            start += take
            if room[j]:
                heapq.heappush(heap, (costs[j], j))
    out = []
    for spans_of_batch in dealt:
        array = np.asarray(spans_of_batch, dtype=np.int64).reshape(-1, 3)
        out.append((array[:, 0], array[:, 1], array[:, 2]))
    return out
