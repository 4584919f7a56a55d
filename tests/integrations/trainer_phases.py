"""Several runs ("phases") of examples/transformers_trainer.py in one torchrun launch, one after the other.

    python -m torch.distributed.run --nproc-per-node W --standalone tests/integrations/trainer_phases.py PHASES.json

PHASES.json is a list of the example's command lines (without the script). Each rank calls the example's
``main()`` once per phase, in order, so it imports torch and transformers once for all of them (most of
a launch's time). Every phase is the example's own run: its parser, model, Trainer, checkpoints and output
files; between phases the process group stays up (the example's ``destroy_process_group`` runs after the
last phase only), so the next phase's Trainer trains on the same gloo group, as a new launch would.

DataLoader workers started by ``forkserver`` (``--mp-context forkserver``, CPython < 3.11.8: gh-112275)
fork from a server that has imported what the example imports (torch, transformers' GPT-2 and Trainer,
shardwise's integration): the fork server of CPython 3.11 never preloads ``__main__`` (it drops the main
path it is given), so each worker, which runs this script again as ``__mp_main__``, would import
transformers again, seconds each, 4 workers a rank in a 2-epoch phase.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import transformers_trainer

# What the example imports, by name (the fork server's sys.path lacks examples/): cached in every worker.
PRELOAD = ["numpy", "torch", "transformers.models.gpt2.modeling_gpt2", "transformers.training_args",
           "transformers.trainer", "shardwise.integrations.transformers"]  # fmt: skip


def _keep_the_group(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``destroy_process_group`` at the end of every phase but the last one."""


def main() -> None:
    phases: list[list[str]] = json.loads(Path(sys.argv[1]).read_text())
    multiprocessing.set_forkserver_preload(PRELOAD)
    destroy = torch.distributed.destroy_process_group
    try:
        for number, argv in enumerate(phases):
            torch.distributed.destroy_process_group = destroy if number == len(phases) - 1 else _keep_the_group
            sys.argv = [transformers_trainer.__file__, *argv]
            transformers_trainer.main()
    finally:
        torch.distributed.destroy_process_group = destroy


if __name__ == "__main__":
    main()
