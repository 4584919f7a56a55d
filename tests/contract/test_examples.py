"""The examples run as users run them (2 CPU processes each), and the integration import surface."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _run(command: list[str], timeout: float = 150) -> None:
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, result.stderr[-4000:]


def _ranks(out: Path) -> list[list[dict[str, object]] | list[list[int]]]:
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_torchrun_example(tmp_path: Path) -> None:
    """torchrun, 2 ranks x 2 workers: primary once per epoch across ranks, every worker stream distinct."""
    out = tmp_path / "run"  # does not exist yet, as with the documented command's run
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
          "examples/torchrun_ddp.py", "--out", str(out)])  # fmt: skip
    ranks = _ranks(out)
    for epoch in (0, 1):
        primary = [i for rank in ranks for b in rank if b["epoch"] == epoch for i in b["indices"][:4]]  # type: ignore[index, call-overload]
        assert Counter(primary) == Counter(range(24))
    noise = [x for rank in ranks for b in rank for x in b["noise"]]  # type: ignore[index, call-overload]
    assert len(set(noise)) == len(noise)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_lightning_example(tmp_path: Path) -> None:
    """Lightning ddp_spawn, default settings: primary once per epoch across ranks, equal steps, new orders."""
    _run([sys.executable, "examples/lightning_ddp.py", "--out", str(tmp_path)])
    ranks = _ranks(tmp_path)
    assert len(ranks[0]) == len(ranks[1]) == 9
    orders = []
    for epoch in range(3):
        primary = [[i for b in rank if b[0] == epoch for i in b[1:5]] for rank in ranks]  # type: ignore[index, misc]
        assert Counter(primary[0] + primary[1]) == Counter(range(24))
        orders.append(primary)
    assert orders[0] != orders[1] != orders[2]


def test_import_shardwise_imports_no_framework() -> None:
    """import shardwise (in a fresh interpreter) leaves lightning, accelerate and torchdata unimported."""
    code = "import sys; from shardwise import *; print(sorted(m for m in ('lightning', 'pytorch_lightning', 'accelerate', " \
           "'torchdata', 'typer', 'matplotlib') if m in sys.modules))"  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=ENV)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("integration", "package", "extra"),
    [("lightning", "lightning.pytorch", "lightning"), ("accelerate", "accelerate", "accelerate"),
     ("torchdata", "torchdata.stateful_dataloader", "torchdata")],
)
def test_missing_framework_names_the_install_command(integration: str, package: str, extra: str) -> None:
    """Without the framework, importing the integration says exactly what to install."""
    top = package.split(".", maxsplit=1)[0]
    code = f"import sys; sys.modules[{top!r}] = None; import shardwise.integrations.{integration}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=ENV)
    expected = (f"shardwise.integrations.{integration} needs '{extra if extra != 'torchdata' else 'torchdata'}'; "
                f"install it with: pip install 'shardwise[{extra}]'")  # fmt: skip
    assert result.returncode != 0
    assert expected in result.stderr
