"""The command line: every error is one line on stderr naming the option or variable, exit status 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shardwise.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
            "PMI_RANK", "PMI_SIZE", "SHARDWISE_SEED")  # fmt: skip

# (id, arguments, environment, strings the one line must contain: the option or variable, the value, what is accepted)
CASES: list[tuple[str, list[str], dict[str, str], tuple[str, ...]]] = [
    ("demo-timeout-negative", ["demo", "--timeout", "-1"], {}, ("--timeout", "-1", "positive")),
    ("demo-timeout-zero", ["demo", "--timeout", "0"], {}, ("--timeout", "0", "positive")),
    ("demo-timeout-nan", ["demo", "--timeout", "nan"], {}, ("--timeout", "nan", "finite")),
    ("demo-timeout-text", ["demo", "--timeout", "abc"], {}, ("--timeout", "abc", "number")),
    ("demo-world-size-zero", ["demo", "--world-size", "0"], {}, ("--world-size", "0", "greater than or equal to 1")),
    ("demo-world-size-17", ["demo", "-w", "17"], {}, ("--world-size", "17", "less than or equal to 16")),
    ("demo-world-size-text", ["demo", "-w", "x"], {}, ("--world-size", "x", "integer")),
    ("demo-world-size-equals", ["demo", "--world-size=-3"], {}, ("--world-size", "-3", "greater than or equal to 1")),
    ("demo-size-negative", ["demo", "--size", "-1"], {}, ("--size", "-1", "greater than or equal to 0")),
    ("demo-size-float", ["demo", "-n", "2.5"], {}, ("--size", "2.5", "integer")),
    ("demo-epochs-zero", ["demo", "--epochs", "0"], {}, ("--epochs", "0", "greater than or equal to 1")),
    ("demo-unknown-option", ["demo", "--bogus"], {}, ("--bogus", "--world-size", "--timeout")),
    ("demo-missing-value", ["demo", "--timeout"], {}, ("--timeout", "requires an argument")),
    ("demo-extra-argument", ["demo", "extra"], {}, ("extra",)),
    ("unknown-command", ["bogus"], {}, ("bogus", "demo", "check")),
    ("check-size-negative", ["check", "--size", "-1"], {}, ("--size", "-1", "greater than or equal to 0")),
    ("check-size-text", ["check", "-n", "many"], {}, ("--size", "many", "integer")),
    ("check-seed-text", ["check"], {"SHARDWISE_SEED": "abc"}, ("SHARDWISE_SEED", "'abc'", "non-negative integer")),
    ("check-seed-negative", ["check"], {"SHARDWISE_SEED": "-1"}, ("SHARDWISE_SEED", "-1", "non-negative integer")),
    ("check-seed-too-big", ["check"], {"SHARDWISE_SEED": str(2**64)}, ("SHARDWISE_SEED", str(2**64))),
    ("check-rank-too-big", ["check"], {"RANK": "3", "WORLD_SIZE": "2"}, ("RANK", "rank=3", "[0, 1]")),
    ("check-rank-text", ["check"], {"RANK": "x", "WORLD_SIZE": "2"}, ("RANK", "'x'", "integer")),
    ("check-world-size-zero", ["check"], {"RANK": "0", "WORLD_SIZE": "0"}, ("WORLD_SIZE", "world_size=0", "positive")),
    ("check-world-size-text", ["check"], {"RANK": "0", "WORLD_SIZE": "two"}, ("WORLD_SIZE", "'two'", "integer")),
    ("check-slurm-rank", ["check"], {"SLURM_PROCID": "5", "SLURM_NTASKS": "2"}, ("SLURM_PROCID", "rank=5", "[0, 1]")),
    ("demo-seed-text", ["demo"], {"SHARDWISE_SEED": "1.5"}, ("SHARDWISE_SEED", "'1.5'", "non-negative integer")),
]
# The same errors end to end in a fresh process (the console script's path), on a few representative rows.
SUBPROCESS = ("demo-timeout-negative", "check-seed-text", "check-rank-too-big")  # the three of issue #16


@pytest.mark.parametrize(("argv", "env", "names"), [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_command_line_error_is_one_line_naming_the_option(
    argv: list[str], env: dict[str, str], names: tuple[str, ...], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A bad option value, option, command or launcher variable exits 2 with one stderr line naming it."""
    for name in LAUNCHER:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n"), err
    for name in names:
        assert name in err, f"{name!r} not in {err!r}"


def _run(case: tuple[str, list[str], dict[str, str], tuple[str, ...]]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "shardwise", *case[1]], env={**env, **case[2]}, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


def test_command_line_errors_in_a_fresh_process_exit_2_without_traceback() -> None:
    """Run as a program, a command-line error prints exactly one line, no traceback, and exits with status 2."""
    cases = [case for case in CASES if case[0] in SUBPROCESS]
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        results = list(pool.map(_run, cases))
    for case, result in zip(cases, results, strict=True):
        assert result.returncode == 2, (case[0], result.stderr)
        assert result.stdout == ""
        assert "Traceback" not in result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert all(name in result.stderr for name in case[3]), (case[0], result.stderr)


def test_help_and_a_good_check_still_exit_0(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--help and a valid launcher environment are not errors."""
    for name in LAUNCHER:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as caught:
        main(["--help"])
    assert caught.value.code == 0
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("SHARDWISE_SEED", "7")
    with pytest.raises(SystemExit) as caught:
        main(["check", "--size", "10"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert "seed: 7" in out and "rank: 1" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """shardwise --version prints the package version and exits 0."""
    import shardwise

    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out == f"shardwise {shardwise.__version__}\n"


def test_verify_help_states_the_factory_contract_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """shardwise verify --help says what the factory must be and what each exit status means."""
    with pytest.raises(SystemExit) as caught:
        main(["verify", "--help"])
    assert caught.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("module-level function that returns a Sampler", "rank=/world_size=", "Exit status: 0 safe",
                  "1 a finding would break training", "2 a usage error"):  # fmt: skip
        assert words in text, words


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_verify_output_into_a_missing_folder_is_refused_before_any_work(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json/--plot into a folder that does not exist: one line naming the option and folder, exit 2, nothing run."""
    missing = tmp_path / "no" / "such"
    with pytest.raises(SystemExit) as caught:
        main(["verify", "tests.verify_zoo:sharded_env", option, str(missing / "report.out")])
    assert caught.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err  # no table: verify never ran
    assert option in err and str(missing) in err and "does not exist" in err


@pytest.mark.parametrize("command", [[], ["demo"], ["check"], ["verify"], ["which"], ["skip"]], ids=str)
def test_help_shows_no_type_after_a_flag(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """--help lists flags (--json, --spawn, --help, --version) bare: no '<bool>' after them."""
    with pytest.raises(SystemExit) as caught:
        main([*command, "--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert "<bool>" not in out and "--help" in out, out


def test_json_is_a_flag_in_verify_and_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--json prints the JSON alone on stdout in both commands (it was a path in verify); --json-file PATH writes it."""
    import json

    monkeypatch.setenv("SHARDWISE_VERIFY_PROCESSES", "1")
    target = "tests.verify_zoo:sharded_env"
    with pytest.raises(SystemExit) as caught:
        main(["verify", target, "-w", "2", "-e", "1", "--json", "--json-file", str(tmp_path / "v.json")])
    assert caught.value.code == 0, capsys.readouterr().err
    printed = json.loads(capsys.readouterr().out)  # nothing but the report
    assert printed["ok"] is True and printed == json.loads((tmp_path / "v.json").read_text())
    with pytest.raises(SystemExit) as caught:
        main(["which", target, "-w", "2", "--step", "0", "--json", "--json-file", str(tmp_path / "w.json")])
    assert caught.value.code in (0, None), capsys.readouterr().err
    assert json.loads(capsys.readouterr().out) == json.loads((tmp_path / "w.json").read_text())


@pytest.mark.parametrize(
    ("given", "read"),
    [
        (["verify", "t:f", "--json", "r.json"], ["verify", "t:f", "--json-file", "r.json"]),  # the older spelling
        (["verify", "--json", "r.json", "t:f", "-w", "2"], ["verify", "--json-file", "r.json", "t:f", "-w", "2"]),
        (["verify", "t:f", "--json=r.json"], ["verify", "t:f", "--json-file=r.json"]),
        (["verify", "--json", "t:f", "-w", "2"], ["verify", "--json", "t:f", "-w", "2"]),  # the flag
        (["verify", "t:f", "--json", "--plot", "p.png"], ["verify", "t:f", "--json", "--plot", "p.png"]),
        (["verify", "-w", "4", "--json", "t:f"], ["verify", "-w", "4", "--json", "t:f"]),
        (["which", "t:f", "--json", "-w", "2"], ["which", "t:f", "--json", "-w", "2"]),
    ],
)
def test_the_older_json_path_spelling_still_writes_a_file(given: list[str], read: list[str]) -> None:
    """`verify --json PATH` (before --json was a flag) is read as --json-file PATH; the flag stays a flag."""
    import typer

    from shardwise.tools.cli import _app, legacy_json

    assert legacy_json(given, typer.main.get_command(_app())) == read
