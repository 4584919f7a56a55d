"""Several runs ("phases") of one example script in one launch, one after the other.

    python -m torch.distributed.run --nproc-per-node W --standalone tests/integrations/example_phases.py \
        EXAMPLE PHASES.json

EXAMPLE names a script of examples/ (``transformers_trainer``, ``fabric_ddp``); PHASES.json is a list of its
command lines (without the script), or of copy steps between them: ``{"copy": folder, "to": folder,
"without": name}`` copies a checkpoint folder without one file (rank 0; every rank waits for it). Each rank calls the example's ``main()`` once per phase, in order, so
it imports torch and the framework once for all of them (most of a launch's time). Every phase is the
example's own run: its parser, model, trainer, checkpoints and output files; between phases the process
group stays up (the example's ``destroy_process_group`` runs after the last phase only), so the next
phase trains on the same gloo group, as a new launch would.

DataLoader workers started by ``forkserver`` (``--mp-context forkserver``, CPython < 3.11.8: gh-112275)
fork from a server that has imported what the example imports (PRELOAD): the fork server of CPython 3.11
never preloads ``__main__`` (it drops the main path it is given), so each worker, which runs this script
again as ``__mp_main__``, would import transformers again, seconds each, 4 workers a rank in a 2-epoch phase.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

# What each example imports, by name (the fork server's sys.path lacks examples/): cached in every worker.
PRELOAD = {
    "transformers_trainer": ["numpy", "torch", "transformers.models.gpt2.modeling_gpt2", "transformers.training_args",
                             "transformers.trainer", "shardwise.integrations.transformers"],
}  # fmt: skip


def _keep_the_group(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``destroy_process_group`` at the end of every phase but the last one."""


def _copy(step: dict[str, str]) -> None:
    """A copy step: rank 0 copies ``step["copy"]`` to ``step["to"]`` without ``step["without"]``; all ranks wait."""
    if int(os.environ.get("RANK", "0")) == 0:
        shutil.copytree(step["copy"], step["to"])
        (Path(step["to"]) / step["without"]).unlink()
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def main() -> None:
    name, spec = sys.argv[1:]
    example = importlib.import_module(name)
    phases: list[list[str] | dict[str, str]] = json.loads(Path(spec).read_text())
    if name in PRELOAD:
        multiprocessing.set_forkserver_preload(PRELOAD[name])
    destroy = torch.distributed.destroy_process_group
    try:
        for number, argv in enumerate(phases):
            if isinstance(argv, dict):
                _copy(argv)
                continue
            torch.distributed.destroy_process_group = destroy if number == len(phases) - 1 else _keep_the_group
            sys.argv = [example.__file__, *argv]
            example.main()
    finally:
        torch.distributed.destroy_process_group = destroy


if __name__ == "__main__":
    main()
