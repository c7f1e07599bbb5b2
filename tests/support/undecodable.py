"""Data a stranger may leave where zkbeat reads a JSON object: each one zkbeat must log and survive."""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.protocol.serialization import Create, SetData
from kazoo.security import OPEN_ACL_UNSAFE

#: Name (for test ids) -> bytes that hold no JSON object; None: no data at all (not even b"").
UNDECODABLE: dict[str, bytes | None] = {
    "no-data": None,
    "not-utf8": b"\xff\xfe{",
    "not-json": b"{nope",
    # (60 kB: also under the dashboard's limit on a request's body)
    "nested-past-the-recursion-limit": b"[" * 30_000 + b"]" * 30_000,
    "a-list": b"[1, 2]",
    "a-number": b"5",
    "null": b"null",
}


def plant(client: KazooClient, path: str, data: bytes | None, **create: object) -> None:
    """Make ``path`` hold ``data`` (created if missing, with ``create``'s options); None is null, as Java writes it."""
    client.ensure_path(path.rsplit("/", 1)[0])
    result = client.handler.async_result()
    if client.exists(path) is None:
        if data is None:
            client._call(Create(path, None, OPEN_ACL_UNSAFE, 0), result)
            result.get(timeout=15)
        else:
            client.create(path, data, **create)
    elif data is None:
        client._call(SetData(path, None, -1), result)
        result.get(timeout=15)
    else:
        client.set(path, data)
    assert client.get(path)[0] == data
