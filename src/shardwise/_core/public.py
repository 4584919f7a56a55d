"""Public objects defined in a private module say where a user imports them from: ``shardwise``.

NOTE [ Public names, public modules ] in ``shardwise/__init__.py``: help(), reprs, tracebacks and
pickles name ``shardwise``, and pickle finds the object there. ``typing.get_type_hints`` resolves a
class's string annotations (``from __future__ import annotations``) in the module its
``__module__`` names, where ``np`` or ``Callable`` are not defined: :func:`public` resolves them
first, in the defining module, so they keep working.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

PUBLIC_MODULE = "shardwise"


def public(*objects: Any) -> None:
    """Say ``__module__ == "shardwise"`` of ``objects`` (defined in the calling module), annotations resolved."""
    for obj in objects:
        own = inspect.get_annotations(obj) if isinstance(obj, type) else None  # its own, not its bases'
        if own:
            hints = typing.get_type_hints(obj, include_extras=True)  # still in the defining module's globals
            obj.__annotations__ = {name: hints[name] for name in own}
        obj.__module__ = PUBLIC_MODULE
