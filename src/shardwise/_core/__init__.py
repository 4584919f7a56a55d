"""The numpy-only core: keyed permutations, plan arithmetic, seeds, world resolution, state format,
array checks, errors, batch-plan and schedule arithmetic, mixtures, classes and sequence packing.

Pure functions over plain values and numpy arrays. Nothing here imports torch or any other part of
shardwise (``tests/contract/test_layers.py`` guards it), so every rule of the plan can be tested without a
process group.
"""
