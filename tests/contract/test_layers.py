"""The layering of docs/design.md, guarded: imports point downward only, and ``import shardwise`` stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import shardwise

PACKAGE = Path(shardwise.__file__).parent

# Each layer and the shardwise subpackages it may import (besides itself). Anything not listed is refused.
ALLOWED: dict[str, set[str]] = {
    "_core": set(),
    "index": {"_core"},
    "data": {"_core", "index"},
    "samplers": {"_core", "index"},
    "integrations": {"_core", "index", "samplers", "data"},
    "tools": {"_core", "index", "samplers", "data"},
}
THIRD_PARTY_REFUSED = {"_core": {"torch"}, "index": {"torch"}}


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else ""


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, absolute (``shardwise.samplers.base``, ``torch.utils.data``), with its line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    # The package a relative import starts from: a module's folder (for __init__.py, its own folder).
    package = ["shardwise", *path.relative_to(PACKAGE).with_suffix("").parts][:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            if node.module is None or node.level:  # `from . import x` imports submodule x
                found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if _layer(p))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_downward(path: Path) -> None:
    """A module imports only its own layer and the layers below it (core < samplers, data < integrations, tools)."""
    layer = _layer(path)
    allowed = ALLOWED[layer] | {layer}
    wrong = []
    for line, module in _imports(path):
        parts = module.split(".")
        if parts[0] == "shardwise":
            target = parts[1] if len(parts) > 1 else ""
            if target not in allowed and not (target in {"", "__init__"} and module == "shardwise"):
                wrong.append(f"line {line}: {module}")
            if module == "shardwise":
                wrong.append(f"line {line}: the package root (import the defining module instead)")
        elif parts[0] in THIRD_PARTY_REFUSED.get(layer, set()):
            wrong.append(f"line {line}: {module}")
    assert not wrong, f"{path.relative_to(PACKAGE)} ({layer}) may import only {sorted(allowed)}: {wrong}"


def test_every_subpackage_has_a_rule() -> None:
    """A new folder under shardwise/ must be given its place in the layering here."""
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= set(ALLOWED), sorted(folders - set(ALLOWED))


def test_import_shardwise_stays_light() -> None:
    """``import shardwise`` in a fresh process imports no framework, no plotting and no CLI library."""
    heavy = ["lightning", "pytorch_lightning", "accelerate", "transformers", "torchdata", "matplotlib", "typer", "rich"]
    code = f"import sys; from shardwise import *; print([m for m in {heavy!r} if m in sys.modules])"  # every name
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _foreign_libraries() -> list[str]:
    from shardwise._core.foreign import TESTED

    return sorted(TESTED)


@pytest.mark.parametrize("library", _foreign_libraries())
def test_every_foreign_private_name_exists_in_the_installed_library(library: str) -> None:
    """Each row of the one table of foreign private names holds in the installed version (skip: not installed)."""
    import importlib.util

    from shardwise._core.foreign import TESTED, missing, rows

    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed")
    assert rows(library), f"{library} has no row in the table"
    absent = [f"{row.owner}.{row.name} ({row.kind})" for row in missing(library)]
    assert not absent, f"{library} (tested: {TESTED[library]}) lacks {absent}"


def test_a_missing_foreign_name_is_one_error_naming_the_version_to_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name the installed library lacks: ImportError naming the name, its user and ``pip install 'lib==tested'``."""
    from shardwise._core import foreign

    gone = foreign.Private("torch", "torch.utils.data.dataloader:_BaseDataLoaderIter", "_no_such_name", "used",
                           "samplers/delivery.py")  # fmt: skip
    monkeypatch.setattr(foreign, "PRIVATE", (*foreign.PRIVATE, gone))
    foreign.check.cache_clear()
    try:
        with pytest.raises(ImportError) as raised:
            foreign.check("torch")
    finally:
        foreign.check.cache_clear()
    message = str(raised.value)
    assert "_BaseDataLoaderIter._no_such_name" in message and "samplers/delivery.py" in message
    assert f"pip install 'torch=={foreign.TESTED['torch']}'" in message
    with pytest.raises(LookupError, match=r"not in shardwise\._core\.foreign\.PRIVATE"):
        foreign.private("torch", "_unlisted")


def test_every_foreign_library_is_pinned_at_its_tested_version() -> None:
    """The table's tested versions are the ones constraints.txt pins."""
    from shardwise._core.foreign import TESTED

    pins = (PACKAGE.parents[1] / "constraints.txt").read_text().lower()
    for library, version in TESTED.items():
        distribution = library.partition(".")[0]  # torch._dynamo: a part of torch, checked on its own
        assert f"{distribution}=={version}" in pins, f"constraints.txt should pin {distribution}=={version}"


def test_check_loaded_checks_only_rows_whose_module_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The samplers' check imports nothing: a row of a module not loaded waits; a loaded one is checked."""
    from shardwise._core import foreign

    waiting = foreign.Private("lightning", "shardwise_no_such_module:Loop", "_gone", "used", "nowhere")
    loaded = foreign.Private("lightning", "shardwise._core.foreign", "_gone", "attribute", "samplers/frameworks.py")
    monkeypatch.setattr(foreign, "PRIVATE", (*foreign.PRIVATE, waiting))
    foreign.check_loaded("lightning")  # no error: its module is not imported
    assert "shardwise_no_such_module" not in sys.modules
    monkeypatch.setattr(foreign, "PRIVATE", (*foreign.PRIVATE, loaded))
    with pytest.raises(ImportError, match=r"lightning==2\.6\.6"):
        foreign.check_loaded("lightning")


SAMPLER_MODULES = {"bucket", "class_balanced", "locality", "mixture", "packed", "scheduled", "sharded", "two_stream",
                   "weighted", "wrappers"}  # fmt: skip
"""The modules of samplers/ that each hold one sampler; the rest (base, inputs, keywords, ...) is the shared shell."""


def test_a_sampler_imports_no_sibling_sampler() -> None:
    """A sampler module imports the shared shell, index and _core: never another sampler's module."""
    folder = PACKAGE / "samplers"
    assert {p.stem for p in folder.glob("*.py")} >= SAMPLER_MODULES
    wrong = [
        f"{name}.py line {line}: {module}"
        for name in sorted(SAMPLER_MODULES)
        for line, module in _imports(folder / f"{name}.py")
        if module.startswith("shardwise.samplers.") and module.split(".")[2] in SAMPLER_MODULES - {name}
    ]
    assert not wrong, wrong
