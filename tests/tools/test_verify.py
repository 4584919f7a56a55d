"""shardwise.verify: every broken sampler of the zoo is caught by the right check; sound samplers pass; the CLI."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import shardwise
from shardwise.tools.cli import main
from shardwise.tools.verify import TargetError, VerificationError, VerifyReport, verify, verify_many
from tests import verify_zoo as zoo
from tests.conformance import CASES


@pytest.fixture(scope="module")
def broken() -> dict[str, VerifyReport]:
    names = list(zoo.BROKEN)
    return dict(zip(names, verify_many([getattr(zoo, n) for n in names], world_size=4, processes=1), strict=False))


@pytest.fixture(scope="module")
def sound() -> dict[str, VerifyReport]:
    factories: dict[str, Any] = {c.name: functools.partial(zoo.shardwise_case, c.name) for c in CASES}
    factories["torch DistributedSampler"] = zoo.torch_distributed_sampler
    factories["torch DistributedSampler()"] = zoo.torch_distributed_sampler_from_group
    factories["ShardedSampler from env"] = zoo.sharded_env
    return dict(zip(factories, verify_many(list(factories.values()), world_size=4, processes=1), strict=False))


def _finding(report: VerifyReport, check: str) -> Any:
    found = [f for f in report.findings if f.check == check]
    assert found, f"{report.target}: expected a {check} finding, got {[f.check for f in report.findings]}"
    return found[0]


@pytest.mark.parametrize("name", list(zoo.BROKEN))
def test_zoo_is_caught_by_its_check(broken: dict[str, VerifyReport], name: str) -> None:
    """Each broken sampler gets a finding from the check that names its bug, with that check's verdict."""
    report = broken[name]
    check = zoo.BROKEN[name]
    finding = _finding(report, check)
    assert report.check(check).verdict == finding.severity
    assert report.ok is (finding.severity == "warning" and all(f.severity == "warning" for f in report.findings))
    assert finding.message and finding.fix


def test_zoo_evidence(broken: dict[str, VerifyReport]) -> None:
    """The evidence says where: the hang step, the shared ranks, the wrong len, the lost resume, the missed path."""
    hang = _finding(broken["rank_sliced"], "equal_steps").evidence
    assert hang["steps_per_rank"] == [32, 31, 31, 31] and hang["hang_step"] == 31 and hang["waiting_ranks"] == [0]
    assert _finding(broken["unsharded_random"], "overlap").evidence["shared_indices"] == zoo.N
    assert _finding(broken["two_stream_global_numpy"], "global_rng").evidence["ranks"] == [0, 1, 2, 3]
    ignored = _finding(broken["batch_sampler_ignores_set_epoch"], "epoch_order").evidence
    assert ignored["identical_epochs"] == [[0, 1]] and ignored["set_epoch_on"] == {"loader.batch_sampler": "FixedSeedBatches"}
    unforwarded = _finding(broken["wrapper_not_forwarding"], "epoch_order").evidence
    assert unforwarded["unreached_set_epoch"] == ["loader.sampler.inner (DistributedSampler)"]
    assert _finding(broken["len_overstates"], "len_matches").evidence["len"] == zoo.N
    assert _finding(broken["len_overstates"], "len_matches").evidence["yielded"] == 251
    assert _finding(broken["hash_order"], "determinism").evidence["step"] == 0
    pairs = _finding(broken["local_rank_two_nodes"], "overlap").evidence["pairs"]
    assert {"ranks": [0, 2], "shared": 251} in pairs and {"ranks": [1, 3], "shared": 251} in pairs
    lossy = _finding(broken["lossy_resume"], "resume").evidence
    assert lossy["repeated"] == lossy["step"] * 8 and lossy["resumed_steps"] == 2 * lossy["expected_steps"]
    assert "iterates the clock" not in _finding(broken["wall_clock_seed"], "determinism").message
    assert _finding(broken["off_by_one"], "index_range").evidence["index"] == zoo.N
    assert _finding(broken["token_imbalance"], "balance").evidence["imbalance"] > 1.25
    paths = _finding(broken["set_epoch_only_on_batch_sampler"], "set_epoch_paths").evidence["frameworks"]
    assert [name.split(" (")[0] for name, ok in paths.items() if not ok] == ["Lightning", "Composer"]
    elastic = _finding(broken["elastic_claim_broken"], "elastic_resume").evidence
    assert elastic["repeated"] > elastic["allowance"]
    assert broken["elastic_claim_broken"].check("resume").verdict == "pass"  # same world size resumes right


@pytest.mark.parametrize("name", [c.name for c in CASES] + ["torch DistributedSampler", "torch DistributedSampler()",
                                                           "ShardedSampler from env"])
def test_sound_samplers_pass(sound: dict[str, VerifyReport], name: str) -> None:
    """Every shardwise sampler and torch's DistributedSampler (also asking the process group) pass every check."""
    report = sound[name]
    assert report.ok, report.summary()
    assert {f.check for f in report.findings} <= {"balance"}, report.summary()  # token balance of fixed-size batches
    assert report.check("equal_steps").verdict == "pass"
    assert report.check("determinism").verdict == "pass"


def test_shardwise_samplers_resume_mid_epoch_and_elastically(sound: dict[str, VerifyReport]) -> None:
    """Resume and elastic resume are checked (not skipped) for shardwise samplers; skipped for torch's."""
    assert sound["ShardedSampler"].check("resume").verdict == "pass"
    assert sound["ShardedSampler"].check("elastic_resume").verdict == "pass"
    assert sound["Bucket-tokens-shuffled"].check("elastic_resume").verdict == "pass"
    assert sound["torch DistributedSampler"].check("resume").verdict == "skipped"


def test_report_api(broken: dict[str, VerifyReport], sound: dict[str, VerifyReport]) -> None:
    """to_dict is JSON with per-rank data; raise_for_findings fails on errors only (warnings on request)."""
    report = broken["rank_sliced"]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False and data["findings"][0]["check"] == "equal_steps"
    assert data["data"]["steps"][0] == [32, 31, 31, 31]
    assert len(data["data"]["overlap"][0]) == 4 and data["data"]["coverage"][0] == 1.0
    with pytest.raises(VerificationError, match="equal_steps"):
        report.raise_for_findings()
    sound["ShardedSampler"].raise_for_findings(severity="warning")
    warned = broken["set_epoch_only_on_batch_sampler"]
    warned.raise_for_findings()
    with pytest.raises(VerificationError, match="set_epoch_paths"):
        warned.raise_for_findings(severity="warning")
    assert shardwise.verify is verify and shardwise.VerifyReport is VerifyReport


def test_targets_that_cannot_be_verified() -> None:
    """A lambda, a malformed spec, a missing module or name fail at once with a TargetError naming the problem."""
    with pytest.raises(TargetError, match="lambda"):
        verify(lambda: None)
    with pytest.raises(TargetError, match="module:function"):
        verify("no_colon_here")
    with pytest.raises(TargetError, match="cannot import module 'no_such_module'"):
        verify("no_such_module:make")
    with pytest.raises(TargetError, match="has no attribute 'nope'"):
        verify("tests/verify_zoo.py:nope")
    with pytest.raises(ValueError, match="world_size should be"):
        verify(zoo.sharded_env, world_size=0)


def test_cli_exit_codes_json_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 0 when safe (8 ranks) with a JSON report and a PNG; 1 for a hang; 2 for a bad target."""
    monkeypatch.setenv("SHARDWISE_VERIFY_PROCESSES", "1")
    out_json, out_png = tmp_path / "report.json", tmp_path / "report.png"
    with pytest.raises(SystemExit) as safe:
        main(["verify", "tests.verify_zoo:sharded_env", "--world-size", "8", "--json", str(out_json),
              "--plot", str(out_png)])
    assert safe.value.code == 0
    report = json.loads(out_json.read_text())
    assert report["ok"] is True and report["data"]["steps"] == [[16] * 8] * 2
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out_png.stat().st_size > 30_000
    with pytest.raises(SystemExit) as unsafe:
        main(["verify", "tests/verify_zoo.py:rank_sliced", "-w", "4"])
    assert unsafe.value.code == 1
    assert "hang at step 31" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as usage:
        main(["verify", "tests/verify_zoo.py:no_such_factory"])
    assert usage.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no_such_factory" in err and "Traceback" not in err


@pytest.mark.multiprocess
def test_spawn_verifies_in_a_real_gloo_group() -> None:
    """spawn=True runs the factory in a real gloo group; torch's DistributedSampler() asks it for the rank."""
    report = verify(zoo.torch_distributed_sampler_from_group, world_size=2, spawn=True, timeout=240)
    assert report.mode.startswith("spawn") and report.ok, report.summary()
    assert report.data["steps"] == [[502, 502], [502, 502]]


def test_a_factory_defined_in_a_script_run_as_main(tmp_path: Path) -> None:
    """A function of a script run as ``__main__`` is verified by its file path (the children import the file)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import shardwise\n"
        "from torch.utils.data import DistributedSampler\n\n"
        "def make(rank, world_size):\n"
        "    return DistributedSampler(range(101), num_replicas=world_size, rank=rank)\n\n"
        "if __name__ == '__main__':\n"
        "    report = shardwise.verify(make, world_size=3)\n"
        "    print(report.target, report.ok, report.data['steps'][0])\n"
    )
    env = {**os.environ, "SHARDWISE_VERIFY_PROCESSES": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env, check=True)
    assert out.stdout.split() == [f"{script}:make", "True", "[34,", "34,", "34]"], out.stderr


def test_spawn_takes_only_a_bool() -> None:
    """spawn=1 or spawn='no' is refused by name, before any process starts (a truthy value is not a choice)."""
    for value in (1, "no", None):
        with pytest.raises(TypeError, match=f"spawn should be True or False, but got spawn={value!r}"):
            verify(zoo.sharded_env, spawn=value)  # type: ignore[arg-type]


SCRIPT_FACTORIES = (
    "import functools, shardwise\n"
    "from torch.utils.data import DistributedSampler\n\n"
    "def make(rank, world_size, n=101):\n"
    "    return DistributedSampler(range(n), num_replicas=world_size, rank=rank)\n\n"
    "def nested():\n"
    "    def inner():\n"
    "        return None\n"
    "    return inner\n\n"
    "for factory in (lambda: None, nested(), functools.partial(make, n=7)):\n"
    "    try:\n"
    "        shardwise.verify(factory)\n"
    "    except ValueError as error:  # shardwise.tools.verify.TargetError\n"
    "        print('refused:', error)\n"
)


def test_a_lambda_or_nested_factory_of_a_script_is_refused_in_the_caller(tmp_path: Path) -> None:
    """In a script run as __main__, a lambda, a nested function or a partial of a script function fail at once."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_FACTORIES)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout + out.stderr
    assert "is a lambda" in lines[0] and "define it at module level" in lines[0]
    assert "is a nested function" in lines[1]
    assert "functools.partial of a function of the script run as __main__" in lines[2]


def test_a_factory_of_an_interactive_session_is_refused_in_the_caller() -> None:
    """A function defined under python -c (no file to import) is refused at once, naming the fix."""
    code = ("import shardwise\ndef make():\n    return range(3)\n"
            "try:\n    shardwise.verify(make)\nexcept ValueError as error:\n    print(error)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "interactive session" in out.stdout and "path/to/file.py:function" in out.stdout, out.stderr


def test_a_script_without_a_main_guard_is_verified(tmp_path: Path) -> None:
    """A script calling verify() at top level works: the children import it only up to that call."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import shardwise\n"
        "from torch.utils.data import DistributedSampler\n\n"
        "def make(rank, world_size):\n"
        "    return DistributedSampler(range(101), num_replicas=world_size, rank=rank)\n\n"
        "report = shardwise.verify(make, world_size=3)\n"
        "print('verified', report.ok, report.data['steps'][0])\n"
    )
    env = {**os.environ, "SHARDWISE_VERIFY_PROCESSES": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env, check=True)
    assert out.stdout.split() == ["verified", "True", "[34,", "34,", "34]"], out.stderr
    # The same file named as a target (the CLI's form) imports in the caller up to the same call.
    assert verify(f"{script}:make", world_size=2).ok
