"""``python -m shardwise``: the same as the ``shardwise`` command."""

from ._cli import main

if __name__ == "__main__":
    main()
