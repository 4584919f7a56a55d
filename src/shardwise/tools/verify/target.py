"""What ``verify`` is given: a factory, named so that a fresh process can import it.

A target is ``package.module:function`` or ``path/to/file.py:function`` (the CLI's form), or a
plain callable (the API's form) that pickles by reference: a module-level function or a
``functools.partial`` of one. A function defined in a script run as ``__main__`` is turned into
its file's path, since the fresh processes have another ``__main__``; importing that file in them
stops at the script's own ``verify()`` call if it has no main guard. A lambda, a nested function
or a function of an interactive session is refused in the caller, at once.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class TargetError(ValueError):
    """The factory cannot be imported, called, or did not return a sampler, batch sampler or DataLoader."""


class _StopAtVerifyCall(BaseException):
    """Raised by a ``verify()`` call made while a target file is being imported (a script with no main guard)."""


_importing: list[str] = []  # target files being imported in this process, innermost last


def stop_if_importing_a_target() -> None:
    """End the import of a target file at its own ``verify()`` call (a script without a main guard).

    A verify process imports the factory's file, which runs the script again: without an
    ``if __name__ == "__main__":`` guard it would call ``verify()`` once more, in every child. The
    import stops there instead, like a main guard would, keeping what the script defined above the
    call (the factory, in the usual script). Raising a ``BaseException`` gets past the script's own
    ``except Exception`` clauses.
    """
    if _importing:
        raise _StopAtVerifyCall


@dataclass(frozen=True)
class FactoryRef:
    """A factory that a fresh process can load: a ``spec`` string, or a callable pickled by reference."""

    spec: str | None = None
    pickled: bytes | None = None

    @property
    def label(self) -> str:
        """How reports name the factory."""
        if self.spec is not None:
            return self.spec
        try:
            factory = self.load()
        except TargetError:
            return "<factory>"
        return _callable_label(factory)

    def load(self) -> Callable[..., Any]:
        """Import (or unpickle) the factory in this process."""
        if self.spec is not None:
            return load_spec(self.spec)
        try:
            factory: Callable[..., Any] = pickle.loads(self.pickled or b"")
        except Exception as error:  # any import error of the user's module lands here
            raise TargetError(f"the factory could not be re-imported in a fresh process: {_one_line(error)}") from None
        return factory


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _callable_label(factory: Callable[..., Any]) -> str:
    inner = getattr(factory, "func", factory)  # functools.partial: show its bound arguments
    module = getattr(inner, "__module__", "?")
    name = getattr(inner, "__qualname__", getattr(inner, "__name__", repr(inner)))
    bound = [repr(a) for a in getattr(factory, "args", ())]
    bound += [f"{k}={v!r}" for k, v in (getattr(factory, "keywords", None) or {}).items()]
    return f"{module}:{name}" + (f"({', '.join(bound)})" if inner is not factory else "")


def _load_file(path: str) -> Any:
    """Import a ``.py`` file as a module, its folder first on ``sys.path`` as when it runs as a script."""
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise TargetError(f"target file {path!r} does not exist")
    stem = os.path.splitext(os.path.basename(full))[0]
    # A name every process derives alike (hash() of a str differs between processes).
    name = f"_shardwise_verify_{stem}_{hashlib.blake2b(full.encode(), digest_size=4).hexdigest()}"
    if name in sys.modules:
        return sys.modules[name]
    folder = os.path.dirname(full)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise TargetError(f"target file {path!r} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: classes defined in the file pickle by this name
    _importing.append(full)
    try:
        spec.loader.exec_module(module)
    except _StopAtVerifyCall:
        pass  # the script's own verify() call: what it defined above the call is the module
    except Exception as error:
        del sys.modules[name]
        raise TargetError(f"importing {path!r} raised {_one_line(error)}") from None
    finally:
        _importing.pop()
    return module


def load_spec(spec: str) -> Callable[..., Any]:
    """Resolve ``module:function`` or ``path/to/file.py:function`` to the callable it names.

    Raises:
        TargetError: the spec is malformed, the module cannot be imported, or the name is missing
            or not callable.
    """
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise TargetError(
            f"target should be 'package.module:function' or 'path/to/file.py:function', but got {spec!r}"
        )
    if where.endswith(".py") or os.sep in where or "/" in where:
        module = _load_file(where)
    else:
        try:
            module = importlib.import_module(where)
        except Exception as error:
            raise TargetError(f"cannot import module {where!r} of target {spec!r}: {_one_line(error)}") from None
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"{where!r} has no attribute {name!r} (target {spec!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TargetError(f"target {spec!r} is a {type(obj).__name__}, not a callable that returns a loader")
    factory: Callable[..., Any] = obj
    return factory


def as_ref(factory: Callable[..., Any] | str) -> FactoryRef:
    """Turn what the caller passed into something a fresh process can load.

    Raises:
        TargetError: the spec cannot be resolved, or the callable does not pickle by reference.
    """
    if isinstance(factory, str):
        load_spec(factory)  # fail here, with a clear message, rather than in every child
        return FactoryRef(spec=factory)
    if not callable(factory):
        raise TargetError(f"factory should be a callable or a 'module:function' string, but got {factory!r}")
    _refuse_unimportable(factory)
    inner = getattr(factory, "func", factory)
    main_file = str(getattr(sys.modules.get("__main__"), "__file__", ""))
    if getattr(factory, "__module__", None) == "__main__" and inner is factory:
        return FactoryRef(spec=f"{os.path.abspath(main_file)}:{factory.__qualname__}")
    try:
        pickled = pickle.dumps(factory)
    except Exception as error:
        raise TargetError(
            f"factory {_callable_label(factory)} cannot be sent to a fresh process ({_one_line(error)}); "
            "define it at module level (not a lambda or a nested function), or pass 'path/to/file.py:function'"
        ) from None
    return FactoryRef(pickled=pickled)


def _refuse_unimportable(factory: Callable[..., Any]) -> None:
    """Refuse, in the caller and at once, a factory that no fresh process could import by its name."""
    inner = getattr(factory, "func", factory)  # functools.partial: the function it calls
    qualname = getattr(inner, "__qualname__", "")
    label = _callable_label(factory)
    fix = "define it at module level with def, or pass 'path/to/file.py:function' or 'package.module:function'"
    if getattr(inner, "__name__", "") == "<lambda>":
        raise TargetError(f"factory {label} is a lambda, which a fresh process cannot import by name; {fix}")
    if "<locals>" in qualname:
        raise TargetError(f"factory {label} is a nested function, which a fresh process cannot import; {fix}")
    if getattr(inner, "__module__", None) != "__main__":
        return
    main = sys.modules.get("__main__")
    if getattr(main, "__file__", None) is None:
        raise TargetError(
            f"factory {label} is defined in an interactive session (a notebook, python -c or a REPL), which "
            "a fresh process cannot import; put it in a .py file and pass 'path/to/file.py:function'"
        )
    if getattr(main, qualname, None) is not inner:
        raise TargetError(f"factory {label} is not the module-level name {qualname!r} of {main.__file__}; {fix}")  # type: ignore[union-attr]
    if inner is not factory:
        raise TargetError(
            f"factory {label} is a functools.partial of a function of the script run as __main__, which a fresh "
            "process cannot import; pass the function itself, or a partial of a function in an importable module"
        )


def call_factory(factory: Callable[..., Any], rank: int, world_size: int) -> Any:
    """Call ``factory`` as a launcher would: ``rank=``/``world_size=`` if it names them (the environment is set)."""
    kwargs: dict[str, int] = {}
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        parameters = {}  # type: ignore[assignment]
    for name, value in (("rank", rank), ("world_size", world_size)):
        parameter = parameters.get(name)
        if parameter is not None and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            kwargs[name] = value
    return factory(**kwargs)
