"""Optional framework integrations; each module imports its framework lazily, only when imported.

- :mod:`shardwise.integrations.lightning`: nothing is needed with default Trainer settings; a
  callback for batch samplers nested where Lightning does not look.
- :mod:`shardwise.integrations.accelerate`: ``prepare_data_loader(accelerator, loader)``, the one
  line Accelerate needs so it does not shard an already distributed sampler a second time.
- :mod:`shardwise.integrations.fabric`: nothing to train; ``state_dict(loader)`` and
  ``load_state_dict(loader, state)`` to resume, since Fabric's epoch count restarts at 0.
- :mod:`shardwise.integrations.transformers`: ``ShardwiseTrainer``, any shardwise sampler in
  ``transformers.Trainer`` with exact resume from its checkpoints.
- :mod:`shardwise.integrations.torchdata`: ``to_stateful(loader)``, a ``StatefulDataLoader`` with the
  same configuration, for mid-epoch resume.

``import shardwise`` imports none of these frameworks.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, package: str, extra: str, integration: str) -> ModuleType:
    """Import ``module``, or raise ImportError saying exactly what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"shardwise.integrations.{integration} needs {package!r}; install it with: pip install 'shardwise[{extra}]'"
        ) from error
