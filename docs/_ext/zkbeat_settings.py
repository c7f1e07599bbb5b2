"""The ``zkbeat-settings`` directive: the settings reference, from zkbeat/conf.py.

Every field of :class:`zkbeat.conf.Settings` is the setting ``zkbeat_<field>``
and carries its shown default and meaning as metadata; this renders them as
one table, so there is no second, hand-written list to drift. A field without
that metadata is a build warning (an error under ``make docs``).
"""

from __future__ import annotations

import dataclasses
import re

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

#: The only inline markup the metadata uses: ``literal``.
_LITERAL = re.compile(r"``(.+?)``")


def _inline(text: str) -> nodes.paragraph:
    """A paragraph of ``text`` with its ``double-backquoted`` parts as literals."""
    paragraph = nodes.paragraph()
    position = 0
    for match in _LITERAL.finditer(text):
        if match.start() > position:
            paragraph += nodes.Text(text[position : match.start()])
        paragraph += nodes.literal(match.group(1), match.group(1))
        position = match.end()
    if position < len(text):
        paragraph += nodes.Text(text[position:])
    return paragraph


def _cell(*paragraphs: nodes.Node) -> nodes.entry:
    entry = nodes.entry()
    for paragraph in paragraphs:
        entry += paragraph
    return entry


class SettingsTable(SphinxDirective):
    """``zkbeat-settings``: one row per setting (name and Django name, default, meaning)."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from zkbeat.conf import Settings

        table = nodes.table(classes=["zkbeat-settings"])
        group = nodes.tgroup(cols=3)
        table += group
        for width in (30, 25, 45):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        group += head
        header = nodes.row()
        for title in ("setting", "default", "meaning"):
            header += _cell(nodes.paragraph(text=title))
        head += header
        body = nodes.tbody()
        group += body
        for field in dataclasses.fields(Settings):
            name = f"zkbeat_{field.name}"
            shown, meaning = field.metadata.get("default"), field.metadata.get("help")
            if not shown or not meaning:
                logger.warning(
                    "zkbeat.conf.Settings.%s has no 'default'/'help' metadata: add it with _setting() in conf.py",
                    field.name,
                    location=self.get_location(),
                )
                continue
            target = nodes.paragraph()
            target += nodes.literal(name, name, ids=[f"setting-{name.replace('_', '-')}"])
            django = nodes.paragraph()
            django += nodes.Text("Django: ")
            django += nodes.literal(f"CELERY_{name.upper()}", f"CELERY_{name.upper()}")
            row = nodes.row()
            row += _cell(target, django)
            row += _cell(_inline(shown))
            row += _cell(_inline(meaning))
            body += row
        return [table]


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("zkbeat-settings", SettingsTable)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
