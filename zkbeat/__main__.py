"""``python -m zkbeat``: the ``zkbeat`` command, for when only the interpreter is on PATH."""

from __future__ import annotations

from .ops.cli import main

if __name__ == "__main__":
    main(prog_name="zkbeat")
