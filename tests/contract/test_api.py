"""The public surface: a curated, sorted __all__, and no optional dependency imported by shardwise."""

from __future__ import annotations

import subprocess
import sys

import shardwise

FOUNDATION = {"Even", "MalformedStateError", "ShardedSampler", "StateMismatchError", "shard", "shard_batches"}


def test_all_is_sorted_unique_and_resolvable() -> None:
    """__all__ is sorted, has no duplicates, and every name exists."""
    assert shardwise.__all__ == sorted(shardwise.__all__)
    assert len(set(shardwise.__all__)) == len(shardwise.__all__)
    assert set(shardwise.__all__) >= FOUNDATION
    for name in shardwise.__all__:
        assert hasattr(shardwise, name), name


def test_public_classes_have_a_runnable_example() -> None:
    """Every public sampler class documents an Example (run by the doctest test below)."""
    for name in shardwise.__all__:
        obj = getattr(shardwise, name)
        if isinstance(obj, type) and name.endswith("Sampler"):
            assert "Example:" in (obj.__doc__ or ""), name


def test_docstring_examples_run() -> None:
    """The Example sections of the foundation's modules run as written."""
    import doctest

    from shardwise._core import permutation as _permutation
    from shardwise.samplers import sharded as _sharded
    from shardwise.samplers import wrappers as _wrappers

    for module in (_permutation, _sharded, _wrappers):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, module.__name__


def test_import_does_not_pull_optional_packages() -> None:
    """Every public name imported imports neither Lightning, Accelerate, torchdata, typer, rich nor matplotlib."""
    code = (
        "import sys; from shardwise import *; "  # every name: `import shardwise` alone imports none (lazy)
        "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'accelerate', 'torchdata', 'typer', 'rich', "
        "'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_public_classes_show_their_real_signature() -> None:
    """inspect.signature, help() and IDEs see each class's parameters, not the metaclass's (*args, **kwargs)."""
    import enum
    import inspect

    checked = 0
    for name in shardwise.__all__:
        obj = getattr(shardwise, name)
        if not inspect.isclass(obj) or issubclass(obj, (BaseException, enum.Enum)):
            continue
        try:
            signature = inspect.signature(obj)
        except ValueError:  # builtins and enums without a Python signature
            continue
        kinds = {parameter.kind for parameter in signature.parameters.values()}
        assert not ({inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} <= kinds), (name, signature)
        init = list(inspect.signature(obj.__init__).parameters)[1:]
        if init and init not in (["args", "kwargs"], ["args", "kwds"]):
            assert list(signature.parameters) == init, (name, signature)
        checked += 1
    assert checked >= 15
    assert list(inspect.signature(shardwise.BucketBatchSampler).parameters)[:2] == ["lengths", "max_tokens"]
    assert "self" not in inspect.signature(shardwise.ShardedSampler).parameters


def test_samplers_share_one_constructor_convention() -> None:
    """Every public sampler and shard()/shard_batches(): data positional, the rest keyword-only, the shared
    keywords last in one order, drop_last=False by default (TwoStreamBatchSampler: True, documented).
    ShardedSampler, the drop-in DistributedSampler, takes torch's signature instead (NOTE [ Drop-in signature ])."""
    import inspect

    from torch.utils.data import DistributedSampler

    from shardwise.samplers.keywords import ORDER

    names = [n for n in shardwise.__all__ if n.endswith("Sampler") and n != "ShardedSampler"]
    names += ["ShardedWrapper", "ShardedBatchWrapper", "shard", "shard_batches"]
    assert len(names) >= 12
    drop_in = inspect.signature(shardwise.ShardedSampler).parameters.values()
    torch_order = inspect.signature(DistributedSampler).parameters.values()
    assert [(p.name, p.kind, p.default) for p in drop_in] == [(p.name, p.kind, p.default) for p in torch_order]
    for name in names:
        parameters = list(inspect.signature(getattr(shardwise, name)).parameters.values())
        positional = [p for p in parameters if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        assert 1 <= len(positional) <= 2, (name, positional)  # the data argument(s) only
        assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in positional), name
        shared = [p.name for p in parameters if p.name in ORDER]
        assert {"seed", "num_replicas", "rank", "drop_last"} <= set(shared), (name, shared)
        assert shared == [n for n in ORDER if n in shared], (name, shared)  # one order
        assert [p.name for p in parameters[-len(shared):]] == shared, name  # and last
        drop_last = next(p for p in parameters if p.name == "drop_last")
        assert drop_last.default is (name == "TwoStreamBatchSampler"), name
        assert drop_last.annotation == "bool", name
    assert "even" in inspect.signature(shardwise.MixtureSampler).parameters  # the deprecated alias still works
    assert "even" in inspect.signature(shardwise.shard).parameters


def test_import_shardwise_is_light_and_names_load_on_first_use() -> None:
    """`import shardwise` and `shardwise --version` import neither torch nor numpy; a name imports its module."""
    code = (
        "import sys, shardwise\n"
        "light = sorted(m for m in ('torch', 'numpy') if m in sys.modules)\n"
        "from shardwise.tools.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "after = sorted(m for m in ('torch', 'numpy') if m in sys.modules)\n"
        "print(light, after, shardwise.ShardedSampler.__module__, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split("\n")[:2] == [f"shardwise {shardwise.__version__}",
                                          "[] [] shardwise.samplers.sharded True"], out.stdout  # fmt: skip


def test_the_lazy_table_names_what_the_typed_imports_import() -> None:
    """NOTE [ A light import shardwise ]: the runtime table, the TYPE_CHECKING imports and __all__ agree."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(shardwise.__file__).read_text())
    guarded = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    typed = {alias.name: "." * node.level + (node.module or "") for node in guarded.body
             if isinstance(node, ast.ImportFrom) for alias in node.names}  # fmt: skip
    assert typed == shardwise._SOURCES
    assert set(shardwise.__all__) == set(shardwise._SOURCES) | {"__version__"}
    assert set(dir(shardwise)) >= set(shardwise.__all__)
    assert shardwise.samplers.sharded.ShardedSampler is shardwise.ShardedSampler  # subpackages still reachable
