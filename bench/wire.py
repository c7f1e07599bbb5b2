"""The wire floor: zkbeat's own messages pushed to Redis by a bare redis-py pipeline.

A leader's publish cost has a floor no scheduler can go below: writing the
message bytes to Redis. This takes the messages zkbeat itself put in the
queue (the same bytes, headers and all) and pushes them again, 1,000 to a
pipeline write (as zkbeat.leading.batch_publish does), to a scratch list that is
deleted after. CPU is this thread's own (``time.thread_time``), so the
row compares zkbeat's leader with the least any Python client could spend.
"""

from __future__ import annotations

import json
import time

import redis

__all__ = ["zkbeat_messages", "push"]

SCRATCH = "zkbench:wire-floor"


def zkbeat_messages(url: str, limit: int = 1000) -> list[bytes]:
    """Up to ``limit`` of the messages zkbeat left in the default queue (those with zkbeat's headers)."""
    client = redis.Redis.from_url(url)
    found: list[bytes] = []
    try:
        start = 0
        while len(found) < limit:
            page = client.lrange("celery", start, start + 4999)
            if not page:
                break
            start += len(page)
            for item in page:
                try:
                    if "zkbeat-entry" in json.loads(item)["headers"]:
                        found.append(item)
                except (ValueError, KeyError, TypeError):
                    continue
    finally:
        client.close()
    return found[:limit]


def push(url: str, messages: list[bytes], count: int, chunk: int = 1000) -> tuple[float, float]:
    """Push ``count`` messages (``messages`` cycled) in pipelines of ``chunk``: (CPU ms per 1,000, wall seconds)."""
    client = redis.Redis.from_url(url)
    try:
        client.delete(SCRATCH)
        client.ping()  # connected before the clock starts, as a leader's is
        cpu, wall = time.thread_time(), time.perf_counter()
        for start in range(0, count, chunk):
            pipe = client.pipeline(transaction=False)
            for index in range(start, min(start + chunk, count)):
                pipe.lpush(SCRATCH, messages[index % len(messages)])
            pipe.execute()
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        client.delete(SCRATCH)
    finally:
        client.close()
    return cpu / count * 1000 * 1000, wall
