"""The generated settings reference covers every setting zkbeat reads."""

from __future__ import annotations

import dataclasses
import inspect
import re

from zkbeat import conf


def test_every_setting_read_is_a_documented_settings_field() -> None:
    """Each ``zkbeat_*`` name read_settings reads is a Settings field with a shown default and a meaning."""
    read = set(re.findall(r'get\("(zkbeat_\w+)"\)', inspect.getsource(conf.read_settings)))
    fields = {f"zkbeat_{field.name}": field for field in dataclasses.fields(conf.Settings)}
    assert read == set(fields)
    for name, field in fields.items():
        assert field.metadata.get("default") and field.metadata.get("help"), name
