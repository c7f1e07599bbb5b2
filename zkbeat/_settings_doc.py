"""The settings reference in ``docs/settings.md``, generated from :class:`zkbeat.conf.Settings`.

Every field of ``Settings`` is the setting ``zkbeat_<field>`` and carries its
shown default and its meaning as metadata, so the table is generated, never
written by hand, and committed, so that it reads the same in the repository
as in the built manual. ``tests/test_docs_settings.py`` fails when the
committed table and ``zkbeat/conf.py`` differ; to bring it up to date::

    make settings-doc                                        # or:
    python -m zkbeat._settings_doc --write docs/settings.md

Without ``--write`` the table is printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

from .conf import Settings

__all__ = ["BEGIN", "END", "markdown_table", "replace_table", "main"]

BEGIN = "<!-- The table below is generated from zkbeat/conf.py: edit conf.py, then run `make settings-doc`. -->"
END = "<!-- End of the generated settings table. -->"

#: The only inline markup the metadata uses: reStructuredText's ``literal``.
_LITERAL = re.compile(r"``(.+?)``")


def _markdown(text: str) -> str:
    """One table cell: ``literal`` as `literal`, pipes escaped, on one line."""
    return _LITERAL.sub(r"`\1`", " ".join(text.split())).replace("|", "\\|")


def markdown_table() -> str:
    """The settings reference as a Markdown table: setting (and its Django name), default, meaning."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for field in dataclasses.fields(Settings):
        shown, meaning = field.metadata.get("default"), field.metadata.get("help")
        if not shown or not meaning:
            raise ValueError(
                f"zkbeat.conf.Settings.{field.name} has no 'default'/'help' metadata: add it with _setting()"
            )
        name = f"zkbeat_{field.name}"
        rows.append(f"| `{name}` (Django: `CELERY_{name.upper()}`) | {_markdown(shown)} | {_markdown(meaning)} |")
    return "\n".join(rows) + "\n"


def replace_table(text: str) -> str:
    """``text`` (a settings page) with the table between BEGIN and END generated afresh."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers of the generated table are missing: {BEGIN!r} ... {END!r}")
    head = text[: start + len(BEGIN)]
    return f"{head}\n\n{markdown_table()}\n{text[end:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zkbeat._settings_doc", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", metavar="PATH", type=Path, help="replace the generated table in this file")
    args = parser.parse_args(argv)
    if args.write is None:
        sys.stdout.write(markdown_table())
        return 0
    text = args.write.read_text(encoding="utf-8")
    updated = replace_table(text)
    if updated != text:
        args.write.write_text(updated, encoding="utf-8")
        print(f"{args.write}: settings table updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
