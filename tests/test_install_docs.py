"""The install commands the README and the quick start give work as written, from a clone and from a wheel.

zkbeat is not on PyPI yet, so ``pip install zkbeat`` finds nothing; the
documents say how to install it from a clone of the repository or from a
wheel built from one. Each ``pip`` line of that block runs here, verbatim,
in a fresh virtualenv, from a directory holding ``zkbeat/``: a copy of the
repository's files, which is what ``git clone`` gives.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parent.parent
#: The sentence that opens the install block in both documents.
MARKER = "zkbeat is not on PyPI yet"


def install_block(document: Path) -> list[str]:
    """The lines of the fenced ``sh`` block that holds MARKER."""
    for block in re.findall(r"```sh\n(.*?)```", document.read_text(encoding="utf-8"), flags=re.DOTALL):
        if MARKER in block:
            return block.splitlines()
    raise AssertionError(f"{document} has no install block saying {MARKER!r}")


def commands(block: list[str]) -> list[list[str]]:
    """The block's commands, in groups separated by a blank line; comments and the clone itself left out."""
    groups: list[list[str]] = [[]]
    for line in block:
        if not line.strip():
            groups.append([])
        elif not line.lstrip().startswith(("#", "git clone")):
            groups[-1].append(line.split("  #", 1)[0].strip())
    return [group for group in groups if group]


def clone(into: Path) -> Path:
    """The repository's files (tracked and new, not ignored) copied to ``into/zkbeat``, as a clone has them."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    target = into / "zkbeat"
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def run(command: str, cwd: Path, venv: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    result = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{command!r} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def test_readme_and_quick_start_give_the_same_install_commands() -> None:
    """README.md and docs/quickstart.md carry one install block, word for word, and no ``pip install zkbeat``."""
    readme, quickstart = install_block(ROOT / "README.md"), install_block(ROOT / "docs" / "quickstart.md")
    assert readme == quickstart
    assert [group[0].split()[:2] for group in commands(readme)] == [["pip", "install"], ["pip", "wheel"]]
    for document in (ROOT / "README.md", ROOT / "docs" / "quickstart.md"):
        assert not re.search(r"^pip install zkbeat\b", document.read_text(), flags=re.MULTILINE), document


def test_the_install_commands_work_as_written(tmp_path: Path) -> None:
    """From a clone, then from a wheel built from it, each route installs a zkbeat that runs outside the tree."""
    clone(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    probe = "cd / && python -c 'import zkbeat, sys; print(zkbeat.__file__)' && zkbeat --version"
    routes = commands(install_block(ROOT / "README.md"))
    for number, route in enumerate(routes):
        if number:
            run("pip uninstall -q -y zkbeat", tmp_path, venv)
        for command in route:
            run(command, tmp_path, venv)
        found = run(probe, tmp_path, venv).stdout.splitlines()
        assert Path(found[0]).resolve().is_relative_to(venv.resolve()), found
        assert found[1].startswith("zkbeat, version "), found
        schedulers = run(
            "python -c 'from importlib.metadata import entry_points; "
            'print([e.value for e in entry_points(group="celery.beat_schedulers")])\'',
            tmp_path,
            venv,
        ).stdout
        assert "zkbeat.scheduler:Scheduler" in schedulers
        assert "redis" in run("pip show celery redis", tmp_path, venv).stdout.lower()
