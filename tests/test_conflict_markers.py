"""No file of the project holds a merge's conflict markers.

A conflict resolved by committing both sides (``<<<<<<<`` ... ``>>>>>>>``)
renders as garbage in the docs and breaks any code it lands in; once it did
land in docs/sharding.md and nothing noticed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where the project's own text lives (the virtualenv, the build's and git's files are not it).
PLACES = ("zkbeat", "tests", "docs", "bench", "demo", "example_project", "docker", ".ci")
TOP = ("README.md", "CHANGELOG.md", "Makefile", "setup.cfg", "pyproject.toml", "noxfile.py", "MANIFEST.in")
MARKER = re.compile(r"^(<{7}|>{7})( |$)|^={7}$", re.MULTILINE)


def _texts() -> list[Path]:
    files = [ROOT / name for name in TOP if (ROOT / name).is_file()]
    for place in PLACES:
        files.extend(path for path in (ROOT / place).rglob("*") if path.is_file() and "__pycache__" not in path.parts)
    return files


def test_no_file_holds_conflict_markers() -> None:
    found = []
    for path in _texts():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # not text
        for match in MARKER.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0).strip()}")
    assert not found, "merge conflict markers:\n" + "\n".join(found)


def test_the_check_sees_a_marker(tmp_path: Path) -> None:
    text = "a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> branch\n"
    assert len(MARKER.findall(text)) == 3
    assert not MARKER.findall("a table rule\n=========\n<<<<<<<< longer\n")
