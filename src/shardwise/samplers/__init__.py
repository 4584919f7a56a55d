"""The samplers: thin ``torch.utils.data`` shells over the core, one sampler a module.

``base`` is the shared shell (lazy rank resolution, ``set_epoch``, auto-advance, the O(1) state);
``frameworks`` the hooks it needs so Lightning and Accelerate leave it alone; ``set_epoch`` and
``worker_seeds`` the loader-level helpers. A new sampler goes here, imports ``base`` and the core,
and never imports ``data``, ``integrations`` or ``tools``.
"""

from . import worker_seeds as _worker_seeds  # noqa: F401  # registers the fork check (gh-112275) once
