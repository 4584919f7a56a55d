"""The command line (``shardwise ...``), the multi-process demo and the process launcher behind both.

The top layer: it may import everything below it. typer and rich are imported only when the
command line runs.
"""
