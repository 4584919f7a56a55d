"""The index a packed batch sampler yields: a sample index that also says where its tokens go."""

from __future__ import annotations

from ..errors import check_int
from ..public import public


class PackedIndex(int):
    """A sample index that also says where its tokens go: ``row`` of the batch, tokens ``[start, stop)``.

    It *is* the sample index (an ``int``), so any dataset indexes with it as usual; a
    :class:`~shardwise.PackedDataset` reads ``row``, ``start`` and ``stop`` to hand
    :func:`~shardwise.pack_collate` the piece and its row. Picklable (DataLoader workers).
    """

    row: int
    start: int
    stop: int

    def __new__(cls, index: int, row: int = 0, start: int = 0, stop: int = -1) -> PackedIndex:
        index = check_int("index", index, minimum=0)
        row = check_int("row", row, minimum=0)
        start = check_int("start", start, minimum=0)
        stop = check_int("stop", stop, minimum=-1)
        self = super().__new__(cls, index)
        self.row, self.start, self.stop = row, start, stop
        return self

    @classmethod
    def trusted(cls, index: int, row: int, start: int, stop: int) -> PackedIndex:
        """Build from values the plan made (non-negative Python ints): no checks, ~4x faster per item."""
        self = int.__new__(cls, index)
        self.row, self.start, self.stop = row, start, stop
        return self

    def __getnewargs__(self) -> tuple[int, int, int, int]:  # type: ignore[override]
        return int(self), self.row, self.start, self.stop

    def __repr__(self) -> str:
        return f"PackedIndex({int(self)}, row={self.row}, start={self.start}, stop={self.stop})"


# Imported as shardwise.<name>, and says so: NOTE [ Public names, public modules ] in shardwise/__init__.py.
public(PackedIndex)
