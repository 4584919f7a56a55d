"""The public surface: a curated, sorted __all__, and no optional dependency imported by shardwise."""

from __future__ import annotations

import ast
import importlib
import pydoc
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np

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
    """Every public name imported imports neither Lightning, Accelerate, torchdata, typer, rich nor matplotlib;
    ``from shardwise import *`` binds exactly the public names (__all__, read from the one list)."""
    code = (
        "import sys; from shardwise import *; "  # every name: `import shardwise` alone imports none (lazy)
        "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'accelerate', 'torchdata', 'typer', 'rich', "
        "'matplotlib') if m in sys.modules)); print(sorted(k for k in dir() if not k.startswith('_')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    public = sorted(["sys", *(name for name in shardwise.__all__ if not name.startswith("_"))])
    assert out.stdout.split("\n")[:2] == ["[]", str(public)], out.stdout


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


def _typed_block() -> list[ast.ImportFrom]:
    """The imports of shardwise/__init__.py's ``if TYPE_CHECKING:`` block."""
    tree = ast.parse(Path(shardwise.__file__).read_text())
    guarded = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    return [node for node in guarded.body if isinstance(node, ast.ImportFrom)]


def test_the_public_names_are_listed_once() -> None:
    """NOTE [ The public names, listed once ]: the TYPE_CHECKING imports are the list; __all__ and the lazy
    imports come from it, and no public name is typed a second time in __init__.py (no table, no __all__).
    ``from shardwise import *`` in a fresh process: test_import_does_not_pull_optional_packages."""
    typed = {alias.name: "." * node.level + (node.module or "") for node in _typed_block() for alias in node.names}
    assert all(alias.asname == alias.name for node in _typed_block() for alias in node.names)  # X as X: re-exported
    assert shardwise._public() == typed
    assert shardwise.__all__ == sorted([*typed, "__version__"])
    tree = ast.parse(Path(shardwise.__file__).read_text())
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert not strings & set(typed), "a public name is typed again in shardwise/__init__.py as a string"
    assigned = {target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(target, ast.Name)}  # fmt: skip
    assert "__all__" not in assigned
    assert set(dir(shardwise)) >= set(shardwise.__all__)
    assert shardwise.samplers.sharded.ShardedSampler is shardwise.ShardedSampler  # subpackages still reachable


def test_public_names_report_a_public_module() -> None:
    """NOTE [ Public names, public modules ]: every public object's __module__ is public and gives it back."""
    for name in shardwise.__all__:
        obj = getattr(shardwise, name)
        if name == "__version__":
            continue
        module = obj.__module__
        assert not any(part.startswith("_") for part in module.split(".")), (name, module)
        assert getattr(importlib.import_module(module), name) is obj, (name, module)
    assert shardwise.Exp3.__module__ == "shardwise" and shardwise.Exp3.__qualname__ == "Exp3"
    assert "in module shardwise" in pydoc.render_doc(shardwise.Exp3)
    assert repr(shardwise.Exp3()) == "Exp3(smoothing=0.9, floor=0.02)"
    assert repr(shardwise.Even.PAD) == "<Even.PAD: 'pad'>"


def test_public_classes_annotations_resolve_where_they_say_they_live() -> None:
    """typing.get_type_hints reads a class's string annotations in the module __module__ names (shardwise):
    ``_core.public.public`` resolved them in the defining module first (np.ndarray, Callable)."""
    for name in shardwise.__all__:
        obj = getattr(shardwise, name)
        if isinstance(obj, type):
            typing.get_type_hints(obj)
    assert typing.get_type_hints(shardwise.PolicyStep)["weights"] is np.ndarray


def test_public_objects_pickle_through_their_public_module() -> None:
    """Pickles name ``shardwise``, not a private module, and round-trip (pickle finds classes by __module__)."""
    import pickle

    import numpy as np

    ledger = shardwise.WeightLedger(interval=4, initial=np.array([0.5, 0.5]), state=np.zeros(0))
    ledger.append(np.array([0.25, 0.75]), np.zeros(0))
    objects = [shardwise.Exp3(smoothing=0.5), shardwise.ExponentiatedGradient(), shardwise.Even.PAD,
               shardwise.WeightSchedule, shardwise.WeightSchedule.by_epoch({0: [1, 1], 2: [1, 3]}),
               shardwise.PackedIndex(7, row=1, start=2, stop=5), shardwise.temperature_weights]  # fmt: skip
    for obj in objects:
        data = pickle.dumps(obj)
        assert b"shardwise._core" not in data and b"shardwise" in data, obj
        back = pickle.loads(data)
        assert type(back) is type(obj) and repr(back) == repr(obj), obj
    error = pickle.loads(pickle.dumps(shardwise.MalformedStateError("x")))
    assert type(error) is shardwise.MalformedStateError and str(error) == "x"
    data = pickle.dumps(ledger)  # no repr of its own: compared by its state
    assert b"shardwise._core" not in data
    assert repr(pickle.loads(data).to_state()) == repr(ledger.to_state())


def test_public_examples_run() -> None:
    """The Example sections of every public name run as written (doctest.testmod of a private module skips the
    objects that say ``__module__ == "shardwise"``, so they run here, in their defining module's namespace)."""
    import doctest

    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    attempted = 0
    for name, source in shardwise._public().items():
        if not any(part.startswith("_") for part in source.split(".")):
            continue  # its module's own testmod runs it
        obj = getattr(shardwise, name)
        namespace = vars(importlib.import_module(source, "shardwise"))
        for test in finder.find(obj, name, module=False, globs=dict(namespace)):
            result = runner.run(test)
            assert result.failed == 0, name
            attempted += result.attempted
    assert attempted >= 9


SHELL_NAMES = {"describe", "even", "load_state_dict", "plan", "skip_id_ranges", "skip_ids", "skip_ledger",
               "skip_positions", "skip_ranges", "skipped_ids", "state_dict", "world"}  # fmt: skip
"""What the sampler shell adds to torch's DistributedSampler names (docs/design.md lists each with its reason)."""


def test_the_shell_adds_the_listed_names_to_torchs_and_no_more() -> None:
    """Every sampler answers torch's names plus these 12 (its own configuration aside), a batch sampler also
    ``sampler`` (the epoch relay); what other modules read of a plan is ``sampler.plan``, not a name on the sampler."""
    from torch.utils.data.distributed import DistributedSampler

    from shardwise.samplers.base import PlanSampler

    torch_names = {n for n in dir(DistributedSampler) if not n.startswith("_")} | {
        "dataset", "drop_last", "epoch", "num_replicas", "num_samples", "rank", "seed", "shuffle", "total_size"}  # fmt: skip
    shell = {name for klass in PlanSampler.__mro__ if klass.__module__.startswith("shardwise")
             for name in vars(klass) if not name.startswith("_")}  # fmt: skip
    assert shell - torch_names == SHELL_NAMES
    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text(encoding="utf-8")
    assert all(f"`{name}`" in design for name in SHELL_NAMES)
    sampler = shardwise.ShardedSampler(10, num_replicas=1, rank=0)
    assert {n for n in dir(sampler) if not n.startswith("_")} - torch_names == SHELL_NAMES
    assert not hasattr(sampler, "sampler") and not any(n.startswith("__pl_saved") for n in dir(sampler))
    batches = shardwise.BucketBatchSampler([3, 1, 2, 5], max_tokens=8, num_replicas=1, rank=0)
    assert "sampler" in dir(batches) and batches.sampler.owner is batches
