"""``python -m shardwise.tools.verify PAYLOAD RESULT``: the entry point of verify's fresh processes.

A separate module so that the worker's classes pickle under their real module name, not ``__main__``.
"""

import sys

from .worker import main

sys.exit(main(sys.argv[1:]))
