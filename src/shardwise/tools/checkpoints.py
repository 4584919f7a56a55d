"""Where each framework's checkpoint keeps the shardwise sampler state: the file to pass to ``shardwise skip``.

``shardwise which --state`` and ``shardwise skip --state`` read one file (JSON or ``torch.save``
output) and find the sampler state nested in it. A framework that checkpoints into a folder
keeps it in one file of that folder:

- Accelerate ``save_state`` (with ``use_stateful_dataloader``): ``dl_state_dict.bin``
  (``dl_state_dict_<i>.bin`` for the i-th prepared loader);
- HF ``Trainer`` with ``ShardwiseTrainer``: ``checkpoint-<step>/shardwise_sampler.json``;
- Lightning ``Trainer`` and Fabric ``fabric.save``: the ``.ckpt`` file itself (a folder only with
  a sharded strategy, which shardwise does not read).

Given a folder, the commands stop with one line naming the file(s) of it to pass.
"""

from __future__ import annotations

from pathlib import Path

KNOWN_FILES = ("shardwise_sampler.json", "dl_state_dict.bin", "dl_state_dict_*.bin")
"""File names, in a checkpoint folder, that hold a shardwise sampler state (HF Trainer, Accelerate)."""


def folder_message(folder: Path, option: str = "--state") -> str:
    """One line for a checkpoint folder given where a file is expected: which file of it to pass."""
    found = sorted({str(path) for pattern in KNOWN_FILES for path in folder.glob(pattern)})
    if found:
        files = " or ".join(found)
        return f"{option} {str(folder)!r} is a folder; pass the file in it that holds the sampler state: {files}"
    return (
        f"{option} {str(folder)!r} is a folder; pass the file that holds the sampler state (HF Trainer: "
        "checkpoint-<step>/shardwise_sampler.json, Accelerate: dl_state_dict.bin, Lightning and Fabric: the .ckpt file)"
    )
