"""``python -m shardwise``: the same as the ``shardwise`` command."""

from .tools.cli import main

if __name__ == "__main__":
    main()
