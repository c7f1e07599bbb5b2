"""The generated settings reference covers every setting zkbeat reads."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

from zkbeat import conf


def test_every_setting_read_is_a_documented_settings_field() -> None:
    """Each ``zkbeat_*`` name read_settings reads is a Settings field with a shown default and a meaning."""
    read = set(re.findall(r'get\("(zkbeat_\w+)"\)', inspect.getsource(conf.read_settings)))
    fields = {f"zkbeat_{field.name}": field for field in dataclasses.fields(conf.Settings)}
    assert read == set(fields)
    for name, field in fields.items():
        assert field.metadata.get("default") and field.metadata.get("help"), name


def test_settings_md_holds_the_table_generated_from_conf() -> None:
    """docs/settings.md, as committed, holds exactly the table zkbeat/conf.py generates (``make settings-doc``)."""
    from zkbeat import _settings_doc

    committed = (Path(__file__).resolve().parent.parent / "docs" / "settings.md").read_text(encoding="utf-8")
    assert _settings_doc.replace_table(committed) == committed, (
        "docs/settings.md differs from zkbeat/conf.py: run `make settings-doc` and commit the result"
    )
    for field in dataclasses.fields(conf.Settings):
        assert f"| `zkbeat_{field.name}` (Django: `CELERY_ZKBEAT_{field.name.upper()}`) |" in committed


def test_settings_table_turns_rest_literals_into_markdown_and_escapes_pipes() -> None:
    """The generator writes ``x`` as `x` and escapes a pipe, so one setting stays one table row."""
    from zkbeat._settings_doc import _markdown

    assert _markdown("a ``b|c``\n   d") == "a `b\\|c` d"
