"""Every private name of another library that shardwise relies on, in one table, and its check.

These are the lines that break on the next framework release: a private attribute read, a
private hook overridden, a private keyword passed, a frame recognised by its method name. Each
use site reads its name from :data:`PRIVATE` with :func:`private` (an unlisted name is a bug
here, not there), and :func:`check` verifies, once per process, that the installed version still
has every name of a library: a missing name is one ``ImportError`` naming the version to pin,
raised when the library's integration is imported (or, for names read by the samplers, when the
library is first met), instead of a wrong result or an ``AttributeError`` mid-run.

The table is plain strings: this module imports no library itself. :func:`check` imports the
modules a row names, and is called only by the layer that uses that library anyway (torch by
``samplers``, HF datasets by ``index``, the frameworks by ``integrations``).

Kinds of row (how :func:`check` verifies it on ``owner``, a module or ``module:Class``):

- ``"attribute"``: ``hasattr(owner, name)`` (a class, function, method or module global);
- ``"used"``: the owner's code names it (an instance attribute its methods set or read, or an
  attribute it reads from other objects); a class is searched through its bases;
- ``"parameter"``: a keyword of ``owner``'s signature.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import CodeType
from typing import Any

__all__ = ["PRIVATE", "TESTED", "Private", "check", "check_loaded", "missing", "private", "rows"]

TESTED = {
    "numpy": "2.4.6",
    "torch": "2.13.0",
    "torch._dynamo": "2.13.0",
    "torchdata": "0.11.0",
    "lightning": "2.6.6",
    "accelerate": "1.15.0",
    "transformers": "5.23.0",
    "datasets": "5.2.0",
    "fsspec": "2026.9.0",
    "pyarrow": "26.0.1",
}
"""The version of each library the whole table was tested with (constraints.txt pins them).

A dotted key is a part of a distribution checked on its own (``torch._dynamo``: importing it costs
~2 s, so the samplers' ``check("torch")`` does not; the code that meets a compiled model does)."""

KINDS = ("attribute", "used", "parameter")


@dataclass(frozen=True)
class Private:
    """One foreign private name: where it lives, how it is checked, and who uses it."""

    library: str
    owner: str
    """``"package.module"`` or ``"package.module:Class"``."""
    name: str
    kind: str
    used_in: str

    @property
    def tested(self) -> str:
        return TESTED[self.library]


_DL = "torch.utils.data.dataloader"
_DELIVERY = "samplers/delivery.py"
_FRAMEWORKS = "samplers/frameworks.py"
_CALLERS = "samplers/callers.py"

PRIVATE: tuple[Private, ...] = (
    # torch: which DataLoader iterator pulls a pass, and how many batches it delivered.
    Private("torch", _DL, "_BaseDataLoaderIter", "attribute", f"{_CALLERS} loader_iterator (a frame's self)"),
    Private("torch", f"{_DL}:_BaseDataLoaderIter", "_next_index", "attribute", f"{_CALLERS} loader_iterator depth"),
    Private("torch", f"{_DL}:_BaseDataLoaderIter", "_index_sampler", "used", f"{_DELIVERY} LoaderDriver"),
    Private("torch", f"{_DL}:_BaseDataLoaderIter", "_num_workers", "used", f"{_DELIVERY} LoaderDriver"),
    Private("torch", f"{_DL}:_BaseDataLoaderIter", "_sampler_iter", "used", f"{_DELIVERY} LoaderDriver"),
    Private("torch", f"{_DL}:_BaseDataLoaderIter", "_num_yielded", "used", f"{_DELIVERY} LoaderDriver"),
    Private("torch", f"{_DL}:_MultiProcessingDataLoaderIter", "_in_order", "used", f"{_DELIVERY} LoaderDriver"),
    # torchdata: a restored StatefulDataLoader iterator sets the delivered count; its batch iterator's frame.
    Private("torchdata", "torchdata.stateful_dataloader.stateful_dataloader:_StatefulBaseDataLoaderIter",
            "_num_yielded", "used", f"{_DELIVERY} LoaderDriver (a restored iterator)"),
    Private("torchdata", "torchdata.stateful_dataloader.sampler", "_BatchSamplerIterator", "attribute",
            f"{_CALLERS} loader_iterator depth"),
    # torchdata: the steps its restoring iterator replays after its last snapshot (another world size: refused).
    Private("torchdata", "torchdata.stateful_dataloader.stateful_dataloader:_StatefulMultiProcessingDataLoaderIter",
            "_STEPS_SINCE_SNAPSHOT", "attribute", f"{_CALLERS} torchdata_replayed_steps"),
    Private("torchdata", "torchdata.stateful_dataloader.stateful_dataloader:_StatefulMultiProcessingDataLoaderIter",
            "next_iter_state", "parameter", f"{_CALLERS} torchdata_replayed_steps (a frame's local)"),
    # Lightning: the batch sampler rebuild record, the loop that pulls before set_epoch, Fabric's epoch count.
    *(
        Private("lightning", "lightning.fabric.utilities.data", name, "used", f"{_FRAMEWORKS} install")
        for name in ("__pl_saved_args", "__pl_saved_kwargs", "__pl_saved_arg_names", "__pl_saved_default_kwargs")
    ),
    Private("lightning", "lightning.pytorch.loops.fit_loop", "_FitLoop", "attribute",
            f"{_CALLERS} lightning_fit_loop"),
    Private("lightning", "lightning.pytorch.loops.fit_loop:_FitLoop", "setup_data", "attribute",
            f"{_CALLERS} lightning_fit_loop (a frame's name)"),
    Private("lightning", "lightning.pytorch.loops.fit_loop:_FitLoop", "_combined_loader", "used",
            "integrations/lightning.py FollowEpochLength"),
    Private("lightning", "lightning.pytorch.trainer.setup", "_val_check_time_interval", "used",
            "integrations/lightning.py FollowEpochLength"),
    Private("lightning", "lightning.fabric.wrappers", "_FabricDataLoader", "attribute", "integrations/fabric.py"),
    Private("lightning", "lightning.fabric.wrappers:_FabricDataLoader", "_num_iter_calls", "used",
            "integrations/fabric.py load_state_dict"),
    # Accelerate: the wrapper that would reshard, and what prepare_data_loader passes to DataLoaderShard.
    *(
        Private("accelerate", "accelerate.data_loader:BatchSamplerShard", name, "attribute",
                f"{_CALLERS} accelerate_resharder depth")
        for name in ("_iter_with_split", "_iter_with_no_split")
    ),
    *(
        Private("accelerate", "accelerate.data_loader:DataLoaderShard", name, "parameter",
                "integrations/accelerate.py prepare_data_loader")
        for name in ("_drop_last", "_non_blocking")
    ),
    Private("accelerate", "accelerate.accelerator:Accelerator", "_is_accelerate_prepared", "used",
            "integrations/accelerate.py prepare_data_loader"),
    # transformers: the Trainer hooks ShardwiseTrainerMixin extends or calls.
    *(
        Private("transformers", "transformers.trainer:Trainer", hook, "attribute", "integrations/transformers.py")
        for hook in ("_run_epoch", "_init_training_state", "_save_checkpoint", "training_step",
                     "_remove_unused_columns", "_get_collator_with_removed_columns", "_get_output_dir")
    ),
    Private("transformers", "transformers.trainer:Trainer", "_train_batch_size", "used",
            "integrations/transformers.py get_train_dataloader"),
    Private("transformers", "transformers.trainer", "skip_first_batches", "attribute",
            "integrations/transformers.py _run_epoch (replaced for a resumed epoch)"),
    # numpy: the mmap object under a memmap (page advice, sampled hashing of a mapped file).
    Private("numpy", "numpy:memmap", "_mmap", "used",
            "index/builders.py advise, index/keys.py sampled digest, _core/class_buckets.py"),
    # torch.compile's wrapper around the model it compiled (packing reads the model's attention).
    Private("torch._dynamo", "torch._dynamo.eval_frame:OptimizedModule", "_orig_mod", "used",
            "data/attention.py unwrap"),
    # transformers: the attention implementation a model runs (no public accessor on the config).
    Private("transformers", "transformers.configuration_utils:PretrainedConfig", "_attn_implementation", "attribute",
            "data/attention.py"),
    # HF datasets: no public accessor for the indices mapping or the fingerprint.
    Private("datasets", "datasets.arrow_dataset:Dataset", "_indices", "used", "index/arrow.py hf_private"),
    Private("datasets", "datasets.arrow_dataset:Dataset", "_fingerprint", "used", "index/arrow.py hf_private"),
    # fsspec: a URL as the filesystem's own listing names it (no public method on the filesystem).
    Private("fsspec", "fsspec.spec:AbstractFileSystem", "_strip_protocol", "attribute",
            "data/sharded/metadata.py _listed"),
    # pyarrow: the Parquet reader that takes a memory pool (ParquetFile takes none); a row for a private module.
    Private("pyarrow", "pyarrow._parquet", "ParquetReader", "attribute", "data/sharded/formats.py _with_pool"),
)  # fmt: skip
"""The table: (library, owner, private name, kind, where shardwise uses it); versions in :data:`TESTED`."""


def private(library: str, name: str) -> str:
    """``name``, after making sure the table lists it for ``library`` (use sites read their names here)."""
    if not any(row.library == library and row.name == name for row in PRIVATE):
        raise LookupError(f"{library}'s {name} is not in shardwise._core.foreign.PRIVATE; add a row for it")
    return name


def rows(library: str) -> tuple[Private, ...]:
    """The table's rows for ``library``."""
    return tuple(row for row in PRIVATE if row.library == library)


def _resolve(owner: str) -> Any:
    module_name, _, qualname = owner.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split(".") if qualname else ():
        obj = getattr(obj, part)
    return obj


def _codes(owner: Any) -> Iterator[CodeType]:
    """The code objects of ``owner``'s functions (a class: through its bases; a module: what it defines)."""
    if inspect.isclass(owner):
        spaces = [vars(klass) for klass in owner.__mro__ if klass is not object]
    else:
        spaces = [vars(owner)]
        spaces += [vars(v) for v in vars(owner).values() if inspect.isclass(v) and v.__module__ == owner.__name__]
    for space in spaces:
        for entry in space.values():
            value = entry.__func__ if isinstance(entry, (staticmethod, classmethod)) else entry
            parts = [value.fget, value.fset] if isinstance(value, property) else [value]
            for part in parts:
                code = getattr(part, "__code__", None)
                if isinstance(code, CodeType):
                    yield code


def _names_in(code: CodeType) -> set[str]:
    names = set(code.co_names) | {c for c in code.co_consts if isinstance(c, str)}
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _names_in(const)
    return names


def _present(row: Private) -> bool:
    try:
        owner = _resolve(row.owner)
    except (ImportError, AttributeError):
        return False
    if row.kind == "attribute":
        return hasattr(owner, row.name)
    if row.kind == "parameter":
        return row.name in inspect.signature(owner).parameters
    return any(row.name in _names_in(code) for code in _codes(owner))


def missing(library: str) -> list[Private]:
    """The rows of ``library`` that the installed version lacks (imports the modules the rows name)."""
    return [row for row in rows(library) if not _present(row)]


def _distribution(library: str) -> str:
    """The distribution a table key belongs to (``torch._dynamo`` -> ``torch``)."""
    return library.partition(".")[0]


def _installed(library: str) -> str:
    try:
        from importlib.metadata import version

        return version(_distribution(library))
    except Exception:  # not installed as a distribution (a source tree): say so
        return "(version unknown)"


def _error(library: str, absent: list[Private]) -> ImportError:
    tested = TESTED[library]
    names = ", ".join(f"{row.owner}.{row.name} (used by {row.used_in})" for row in absent)
    return ImportError(
        f"shardwise relies on private names of {library} that {library} {_installed(library)} lacks: {names}; "
        f"shardwise is tested with {_distribution(library)}=={tested}: install it with pip install "
        f"'{_distribution(library)}=={tested}'"
    )


@functools.cache
def check(library: str) -> None:
    """Raise ImportError, naming the version to pin, if the installed ``library`` lacks a name of the table.

    Done once per process per library (cached); imports the modules the rows name, then costs one
    scan of the owners' code (well under a millisecond for torch's rows).
    """
    absent = missing(library)
    if absent:
        raise _error(library, absent)


_checked: set[Private] = set()


def check_loaded(library: str) -> None:
    """:func:`check`, for the rows of ``library`` whose module is already imported; imports nothing.

    For the samplers, which meet a framework only when it drives them (Lightning's rebuild, Accelerate's
    wrapper): each row is checked once, the first time its module is loaded at a call.
    """
    todo = [row for row in rows(library) if row not in _checked and row.owner.partition(":")[0] in sys.modules]
    absent = [row for row in todo if not _present(row)]
    if absent:
        raise _error(library, absent)
    _checked.update(todo)
