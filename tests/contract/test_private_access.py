"""No module reaches into another module's private attributes: what it needs is a public method.

A private name (``_plan_size``, ``_seed_arg``) belongs to the module that defines it. Reading it on
an object other than ``self``/``cls`` from another module ties the two modules together in a way
no signature shows, and breaks silently when the owner changes (docs/design.md, "Constructor
keywords"). Private names of *other* libraries are a separate
matter: they live in ``shardwise._core.foreign``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import shardwise

PACKAGE = Path(shardwise.__file__).parent

ALLOWED: set[tuple[str, str]] = set()
"""``(module, name)`` accesses tolerated, each with a comment saying why no public method serves. None."""


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_self(node: ast.expr) -> bool:
    """``self``, ``cls``, ``super()`` or ``type(self)``: an object's own attributes, always allowed."""
    if isinstance(node, ast.Name):
        return node.id in {"self", "cls"}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id == "super" or (node.func.id == "type" and len(node.args) == 1 and _is_self(node.args[0]))
    return False


def _definitions(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The private ``(attributes, methods)`` a module defines: assigned on self/cls, declared in a class body, slots."""
    attributes: set[str] = set()
    methods: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name):
                    methods.add(item.name)
                targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
                for target in targets:
                    if isinstance(target, ast.Name) and _private(target.id):
                        attributes.add(target.id)
                    if isinstance(target, ast.Name) and target.id == "__slots__" and item.value is not None:
                        attributes |= {c.value for c in ast.walk(item.value) if isinstance(c, ast.Constant) and isinstance(c.value, str) and _private(c.value)}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and _private(part.attr) and _is_self(part.value):
                        attributes.add(part.attr)
    return attributes, methods


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(PACKAGE)): ast.parse(p.read_text(), filename=str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def foreign_private_accesses(modules: dict[str, ast.Module], checked: dict[str, ast.Module] | None = None) -> list[str]:
    """``module:line: expression`` of every access to a private name another shardwise module owns.

    An access ``obj._name`` (``obj`` not self/cls) in module M reaches into another module when
    M does not define ``_name`` at all, or when ``_name`` is a method defined in another module
    (M overriding a hook does not make another object's hook M's to call).
    """
    owners: dict[str, set[str]] = defaultdict(set)
    method_owners: dict[str, set[str]] = defaultdict(set)
    for module, tree in modules.items():
        attributes, methods = _definitions(tree)
        for name in attributes | methods:
            owners[name].add(module)
        for name in methods:
            method_owners[name].add(module)
    found = []
    for module, tree in (checked or modules).items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)) or _is_self(node.value):
                continue
            name = node.attr
            if not owners.get(name) or (module, name) in ALLOWED:
                continue  # not a shardwise name (another library's private names live in _core/foreign.py)
            if module not in owners[name] or method_owners[name] - {module}:
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def test_no_module_reads_another_modules_private_attributes() -> None:
    """src/shardwise reads no private attribute of another module's objects (the allow-list is empty)."""
    found = foreign_private_accesses(_modules())
    assert not found, "use (or add) a public method on the owning class instead:\n" + "\n".join(found)


def test_no_module_imports_another_modules_private_names() -> None:
    """``from .x import _name`` across shardwise modules is refused too: what is shared is public."""
    found = []
    for module, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("shardwise")):
                found += [f"{module}:{node.lineno}: {alias.name}" for alias in node.names if _private(alias.name)]
    assert not found, "make the name public in its module instead:\n" + "\n".join(found)


def test_the_check_finds_a_reach_into_another_module() -> None:
    """The detector flags the accesses issue 20 named (so the test above is not vacuous)."""
    modules = _modules()
    probe = ast.parse(
        "def f(sampler, candidate, inner):\n"
        "    own = sampler._plan_size(0)\n"  # a method another module defines
        "    return candidate._num_replicas_arg, inner._seed_arg, self._seed_arg\n"  # attributes; self's is fine
    )
    found = foreign_private_accesses({**modules, "samplers/probe.py": probe}, {"samplers/probe.py": probe})
    assert sorted(line.split(": ", 1)[1] for line in found) == [
        "candidate._num_replicas_arg",
        "inner._seed_arg",
        "sampler._plan_size",
    ]


DOCUMENTED: dict[str, str] = {
    "sys._getframe": "the Python library reference's own API (CPython); stack walks: issue 48, step 2",
}
"""Underscored names that are another library's documented API, not a private reach; each with its reason.
Also documented, by their form: namedtuple's ``_asdict``/``_replace``/``_fields``/``_make``/``_field_defaults``
and enum's sunder names (``_value_``)."""

_NAMEDTUPLE_API = {"_asdict", "_replace", "_fields", "_make", "_field_defaults"}


def _ours(modules: dict[str, ast.Module]) -> set[str]:
    """Every private name a shardwise module defines: attributes, methods, and module-level names."""
    ours: set[str] = set()
    for tree in modules.values():
        attributes, methods = _definitions(tree)
        ours |= attributes | methods
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                ours.add(node.name)
            for target in node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []:
                ours |= {part.id for part in ast.walk(target) if isinstance(part, ast.Name)}
    return {name for name in ours if _private(name)}


def _documented(name: str) -> bool:
    return name in _NAMEDTUPLE_API or (len(name) > 2 and name.startswith("_") and name.endswith("_"))  # _sunder_


_READERS = {"getattr", "hasattr", "setattr", "delattr", "getattr_static", "attrgetter"}


def _table() -> tuple[set[str], set[str]]:
    """The private names and the owner modules of ``_core.foreign``'s table."""
    from shardwise._core.foreign import PRIVATE

    return {row.name for row in PRIVATE}, {row.owner.partition(":")[0] for row in PRIVATE}


def foreign_names_by_string(modules: dict[str, ast.Module]) -> list[str]:
    """``module:line: call`` of every getattr/hasattr/setattr/delattr (and ``inspect.getattr_static``,
    ``operator.attrgetter``) of a private name given as a string that no shardwise module defines: another
    library's private name, which must come from ``_core.foreign``'s table (``private(library, name)``), not a
    literal the table's check cannot see."""
    ours = _ours(modules)
    found = []
    for module, tree in modules.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            function = node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if function not in _READERS:
                continue
            names = node.args if function == "attrgetter" else node.args[1:2]
            if any(isinstance(name, ast.Constant) and isinstance(name.value, str)
                   and any(_private(part) and part not in ours for part in name.value.split(".")) for name in names):  # fmt: skip
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def foreign_private_reads(modules: dict[str, ast.Module]) -> list[str]:
    """``module:line: code`` of every other library's private name read as an attribute (``config._attn``) or
    imported (``from pyarrow._parquet import ...``, ``from lib import _name``) that the table does not list: read
    it through ``_core.foreign`` instead (``getattr(obj, private(library, name))``, or a row for the import)."""
    ours = _ours(modules)
    names, owners = _table()
    found = []
    for module, tree in modules.items():
        if module == "_core/foreign.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and not _is_self(node.value):
                if node.attr in ours or _documented(node.attr) or ast.unparse(node) in DOCUMENTED:
                    continue
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                imported = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for path in imported:
                    if path.split(".")[0] == "shardwise":
                        continue
                    privately = [alias.name for alias in node.names if _private(alias.name)] if isinstance(node, ast.ImportFrom) else []
                    if (any(_private(part) for part in path.split(".")) and path not in owners) or set(privately) - names:
                        found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def test_foreign_private_names_are_not_read_by_string() -> None:
    """A foreign private name read with getattr("_name") goes through the table (numpy's memmap._mmap was one)."""
    found = foreign_names_by_string(_modules())
    assert not found, "read it as getattr(obj, private(library, name)) with a row in _core/foreign.py:\n" + "\n".join(found)
    planted = ast.parse(
        'raw = getattr(values, "_mmap", None)\nown = hasattr(cls, "_keyword_kind")\n'
        'static = inspect.getattr_static(model, "_orig_mod")\nget = operator.attrgetter("config._attn_implementation")'
    )
    assert foreign_names_by_string({"planted.py": planted, **_modules()}) == [
        "planted.py:1: getattr(values, '_mmap', None)",
        "planted.py:3: inspect.getattr_static(model, '_orig_mod')",
        "planted.py:4: operator.attrgetter('config._attn_implementation')",
    ]


def test_foreign_private_names_are_not_read_as_attributes() -> None:
    """Another library's private attribute (``config._attn_implementation``) or private module
    (``pyarrow._parquet``) is read through the table, where its check sees it; sys._getframe is documented."""
    found = foreign_private_reads(_modules())
    assert not found, (
        "read it as getattr(obj, private(library, name)) with a row in _core/foreign.py (an import: a row naming "
        "its module):\n" + "\n".join(found)
    )
    planted = ast.parse(
        "impl = config._attn_implementation\nown = self._seed_arg\nframe = sys._getframe(1)\n"
        "from torch.utils.data.dataloader import _DatasetKind\nimport torch._dynamo\n"
        "row = step._replace(weights=None)\nvalue = member._value_\nfrom pyarrow._parquet import ParquetReader"
    )
    assert foreign_private_reads({**_modules(), "planted.py": planted}) == [
        "planted.py:1: config._attn_implementation",
        "planted.py:4: from torch.utils.data.dataloader import _DatasetKind",
        "planted.py:5: import torch._dynamo",
    ]
