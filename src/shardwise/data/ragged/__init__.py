"""``RaggedArray``: N variable-length arrays in one memory-mapped store that every process shares.

A store is a directory of three files that numpy alone can read::

    values.npy     (total_rows, *feature_shape)  every sample's rows, one after the other
    offsets.npy    (N + 1,) int64                 sample i is values[offsets[i]:offsets[i + 1]]
    manifest.json  format name and version, dtype, feature shape, N, total rows, file sizes, checksums

Both ``.npy`` files are opened with ``mmap``: the bytes live once in the operating system's page
cache, shared by every rank and DataLoader worker of the node, and only the pages a process
touches are ever read. Opening reads the manifest, the two ``.npy`` headers, the offsets
(8 bytes a sample) and 16 blocks of 4 KiB of the values, whatever the store's size.

:class:`RaggedWriter` builds a store from any iterable of arrays with bounded memory (one sample
at a time, offsets flushed every 65536 samples), in a temporary directory beside the target that
is renamed into place only once the manifest, written last, is on disk. A directory without a
manifest, or whose files disagree with it, never opens.
"""

from .format import MANIFEST, OFFSETS, VALUES, RaggedStoreError
from .reader import RaggedArray
from .writer import RaggedWriter

__all__ = ["MANIFEST", "OFFSETS", "VALUES", "RaggedArray", "RaggedStoreError", "RaggedWriter"]
