"""README's set-up section: its test command is CI's, and it says how a stock machine gets the torch build pinned."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _setup() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index("## Set up and run"):readme.index("## What is in it")]


def test_readme_test_command_is_the_line_ci_runs() -> None:
    """The README's test command, character for character, is a line of .ci/run (which runs it verbatim)."""
    commands = re.findall(r"```bash\n(python3 -m venv .*?)\n```", _setup())
    assert len(commands) == 2, commands  # the main job and the tests
    assert commands[1] in (ROOT / ".ci" / "run").read_text().splitlines()


def test_readme_says_where_the_pinned_torch_build_comes_from() -> None:
    """constraints.txt pins torch's CPU build, which PyPI does not have (PyPI's Linux wheel is the CUDA build, and
    the constraint then refuses it): README names the build, says what happens without the CPU index, and gives it."""
    pinned = re.search(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    assert pinned is not None
    setup = _setup()
    assert f"`torch=={pinned.group(1)}`" in setup
    if pinned.group(1).endswith("+cpu"):
        assert "CUDA build" in setup and "ResolutionImpossible" in setup
        assert f"export PIP_EXTRA_INDEX_URL={CPU_INDEX}" in setup and f"--index-url {CPU_INDEX}" in setup
