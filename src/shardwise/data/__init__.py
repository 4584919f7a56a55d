"""Data utilities beside the samplers: the memory-mapped ragged store and the padding collate.

They import the core only, never the samplers.
"""
