"""``zkbeat dashboard`` in a real browser (Debian's chromium, headless) against real ZooKeeper and 3
``celery beat`` replicas: the leader it shows, a failover without a reload, pause and run-now from the page,
controls refused without the secret, hostile entry names, its JSON against ``zkbeat status --json``, and with
``zkbeat_shards`` = 3 each shard's leader and line."""

from __future__ import annotations

import json
import signal
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from kazoo.client import KazooClient

from tests.support.browser import Dashboard, browser_page
from tests.support.faults import ledger_slots, wait_until_watched
from tests.support.helpers import wait_for
from tests.support.processes import Cluster
from tests.test_cli import zkbeat
from tests.test_shards_processes import shards_env, wait_settled
from zkbeat.coordination.candidates import CandidateReader
from zkbeat.coordination.shards import election_path, shard_of

pytestmark = pytest.mark.processes

SCHEDULE = {"tick": 1, "held": 1, "hourly": 3600}
SECRET = "correct horse battery staple"


def paris() -> tuple[dict[str, str], str]:
    """A daily crontab entry, "report", in Paris besides SCHEDULE (the replicas' environment), and its words.

    At half past an hour twelve hours from now: at a fixed time of day it
    would fire while the test runs in one run of a few thousand, and the
    test says it never ran.
    """
    hour = (datetime.now(ZoneInfo("Europe/Paris")).hour + 12) % 24
    env = {
        "ZKBEAT_TEST_CRONTAB": json.dumps({"report": {"minute": 30, "hour": hour}}),
        "ZKBEAT_TEST_CONF": json.dumps({"timezone": "Europe/Paris"}),
    }
    return env, f"at {hour:02d}:30 Europe/Paris"


#: 1,000 characters of markup, script, control and bidi characters.
_HOSTILE_HEAD = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">\x07\x1b[31m\u202e\n'
HOSTILE = _HOSTILE_HEAD + "x" * (1000 - len(_HOSTILE_HEAD))


def printable(text: str) -> str:
    """What the page shows for ``text``: control and format characters as \\uXXXX (app.js's printable)."""
    return "".join(
        f"\\u{ord(ch):04x}" if unicodedata.category(ch) in ("Cc", "Cf") or ch in "\u2028\u2029" else ch for ch in text
    )


@pytest.fixture
def start(make_cluster: Callable[..., Cluster], tmp_path: Path) -> Iterator[Callable[..., tuple[Cluster, Dashboard]]]:
    """``start(schedule=..., secret=...)``: 3 replicas that have published, and a dashboard on them."""
    dashboards: list[Dashboard] = []

    def make(
        schedule: dict[str, float] | None = None, secret: str | None = SECRET, extra_env: dict[str, str] | None = None
    ) -> tuple[Cluster, Dashboard]:
        cluster = make_cluster(3, schedule=schedule or SCHEDULE, extra_env=extra_env)
        cluster.start()
        wait_for(lambda: {"tick"} <= {p.entry for p in cluster.publishes()}, timeout=60, message=cluster.logs)
        dashboard = Dashboard(dict(cluster.env), tmp_path, secret=secret)
        dashboards.append(dashboard)
        dashboard.wait_ready()
        return cluster, dashboard

    yield make
    for dashboard in dashboards:
        dashboard.stop()


def shown_leader(page: Any) -> tuple[str, str]:
    """(identity, epoch) of the leader the page shows."""
    return page.text_content("#leader .identity"), page.get_attribute("#leader", "data-epoch")


def row(page: Any, name: str) -> Any:
    """The entries table's row of ``name`` (found by its data attribute, whatever the name holds)."""
    handle = page.evaluate_handle(
        "name => Array.from(document.querySelectorAll('#entries tbody tr')).find(tr => tr.dataset.name === name)",
        name,
    )
    element = handle.as_element()
    assert element is not None, f"no row for {name!r}"
    return element


def has_row(page: Any, name: str) -> bool:
    return page.evaluate(
        "name => Array.from(document.querySelectorAll('#entries tbody tr')).some(tr => tr.dataset.name === name)", name
    )


def open_page(page: Any, dashboard: Dashboard, secret: str | None = None) -> None:
    page.goto(dashboard.url)
    wait_for(lambda: page.get_attribute("#leader", "data-epoch"), timeout=15, message="the page shows no leader")
    if secret is not None:
        page.fill("#secret", secret)
        page.fill("#operator", "ops-on-call")


def test_page_shows_the_leader_and_the_next_one_after_a_kill_without_a_reload(
    start: Callable[..., tuple[Cluster, Dashboard]], zk_client: KazooClient
) -> None:
    """The page names the replica that publishes; after kill -9 of it, the new leader appears by itself."""
    cluster, dashboard = start()
    leader = wait_for(cluster.leader, timeout=30)
    with browser_page() as page:
        open_page(page, dashboard)
        wait_for(lambda: shown_leader(page)[0] == leader.identity, timeout=10, message=lambda: str(shown_leader(page)))
        old_epoch = shown_leader(page)[1]

        # The page and the replicas agree on the rest of the line too (once the last to start has joined it:
        # start() waits for the first publish, not for every replica).
        def rows() -> list[str]:
            return page.eval_on_selector_all("#candidates tbody tr", "trs => trs.map(tr => tr.children[2].textContent)")

        wait_for(lambda: sorted(rows()) == sorted(r.identity for r in cluster.replicas), timeout=60,
                 message=lambda: f"the page's line: {rows()}\n{cluster.logs()}")  # fmt: skip

        page.evaluate("window.__still_this_page = true")  # gone if the page were reloaded
        wait_until_watched(zk_client, cluster.root, leader.pid, cluster.logs)
        leader.signal(signal.SIGKILL)
        killed = time.monotonic()
        # The issue's bound is 2 s from the kill to the page (printed below, not asserted: a loaded machine
        # may take longer); a page that needed a reload would never get there.
        wait_for(
            lambda: shown_leader(page)[1] not in (old_epoch, "") and shown_leader(page)[0] != leader.identity,
            timeout=15,
            message=lambda: f"the page still shows {shown_leader(page)}",
        )
        print(f"the page showed the new leader {time.monotonic() - killed:.2f} s after kill -9")
        assert page.evaluate("window.__still_this_page") is True
        identity, epoch = shown_leader(page)
    # The leader shown is the one that publishes now.
    wait_for(lambda: any(p.epoch == int(epoch) for p in cluster.publishes()), timeout=15, message=cluster.logs)
    assert next(p for p in cluster.publishes() if p.epoch == int(epoch)).identity == identity


def test_pause_from_the_page_stops_the_entry_and_shows_its_note(
    start: Callable[..., tuple[Cluster, Dashboard]], zk_client: KazooClient
) -> None:
    """Pause with a note from the page: the entry publishes nothing more and every view shows who and why."""
    cluster, dashboard = start()
    note = "db migration <b>until</b> 3pm & then some"
    with browser_page() as page:
        open_page(page, dashboard, SECRET)
        held = row(page, "held")
        held.query_selector(".note-input").fill(note)
        held.query_selector(".action-pause").click()
        wait_for(lambda: row(page, "held").query_selector(".pause-note") is not None, timeout=20)
        assert row(page, "held").query_selector(".pause-note").text_content() == note
        paused_at = time.time()
        # Every claim of "held" before the pause is in the slot its znode holds now; none may follow (a claim
        # made just before the pause may be sent after it, late on a loaded machine: when says nothing).
        claimed = ledger_slots(zk_client, cluster.root).get("held")  # None: never claimed
        state = row(page, "held").inner_text()
        assert "paused" in state and "ops-on-call" in state
        # Held for as long as "tick" publishes three more times; "held" not once.
        base = sum(1 for p in cluster.publishes() if p.entry == "tick" and p.at > paused_at)
        wait_for(
            lambda: sum(1 for p in cluster.publishes() if p.entry == "tick" and p.at > paused_at) >= base + 3,
            timeout=20,
        )
        assert [p for p in cluster.publishes() if p.entry == "held" and (claimed is None or p.slot > claimed)] == []
        status = json.loads(zkbeat("-A", "tests.support.beatapp", "status", "--json", env=dict(cluster.env)).stdout)
        assert next(e for e in status["entries"] if e["name"] == "held")["paused"]["note"] == note

        row(page, "held").query_selector(".action-resume").click()
        wait_for(lambda: any(p.entry == "held" and p.at > time.time() - 2 for p in cluster.publishes()), timeout=15)
        wait_for(lambda: row(page, "held").query_selector(".pause-note") is None, timeout=20)


def test_run_now_from_the_page_publishes_exactly_once(start: Callable[..., tuple[Cluster, Dashboard]]) -> None:
    """One click on "run now" is one publish, with its zkbeat-manual header, and the page shows it as manual."""
    cluster, dashboard = start()
    with browser_page() as page:
        open_page(page, dashboard, SECRET)
        assert [p for p in cluster.publishes() if p.entry == "hourly"] == []
        row(page, "hourly").query_selector(".action-run").click()
        runs = wait_for(lambda: [p for p in cluster.publishes() if p.entry == "hourly"], timeout=15)
        wait_for(lambda: "run now request-" in row(page, "hourly").inner_text(), timeout=20)
        # Let more ticks go by (the leader re-reads its triggers every pass): still one.
        seen = len(cluster.publishes())
        wait_for(lambda: len(cluster.publishes()) >= seen + 4, timeout=20)
        runs = [p for p in cluster.publishes() if p.entry == "hourly"]
        assert len(runs) == 1 and runs[0].manual is not None, runs
        assert runs[0].manual in row(page, "hourly").inner_text()
        # Its recent runs: the one manual run, by the leader, in the row's list.
        recent = row(page, "hourly").query_selector(".recent")
        assert recent.query_selector("summary").text_content() == "1 run, last manual"
        recent.query_selector("summary").click()
        shown = recent.eval_on_selector_all("ol li span", "spans => spans.map(s => [s.className, s.textContent])")
        assert dict(shown)["replica"] == runs[0].identity and dict(shown)["kind"] == "manual", shown
        assert dict(shown)["epoch"] == f"epoch {runs[0].epoch}", shown
        assert dashboard.state()["entries"][0]["pending"] == []


def test_without_the_secret_controls_are_refused_and_the_page_still_renders(
    start: Callable[..., tuple[Cluster, Dashboard]], zk_client: KazooClient
) -> None:
    """A dashboard started without a secret answers 403 to every control, and shows the cluster read-only."""
    cluster, dashboard = start(secret=None)
    for action in ("pause", "resume", "run"):
        status, body = dashboard.post(action, {"entry": "held", "note": "x"}, secret=SECRET)
        assert status == 403 and "controls are off" in body["error"], (action, status, body)
    with browser_page() as page:
        open_page(page, dashboard)
        wait_for(lambda: has_row(page, "held"), timeout=10)
        assert "read-only" in page.text_content("#controls-state")
        assert row(page, "held").query_selector(".action-pause").is_disabled()
        # The browser's own request, as a click would send it, is refused as well.
        answer = page.evaluate(
            """async () => (await fetch('/api/pause', {method: 'POST', headers: {'Content-Type': 'application/json'},
                body: JSON.stringify({entry: 'held'})})).status"""
        )
        assert answer == 403
    assert all(e["paused"] is None for e in dashboard.state()["entries"])
    assert [p for p in cluster.publishes() if p.manual] == []


def test_with_a_secret_a_wrong_one_or_another_site_is_refused(
    start: Callable[..., tuple[Cluster, Dashboard]],
) -> None:
    """Controls need the exact secret, and a request from another origin is refused even with it."""
    cluster, dashboard = start()
    assert dashboard.post("pause", {"entry": "held"})[0] == 403
    assert dashboard.post("pause", {"entry": "held"}, secret=SECRET[:-1])[0] == 403
    assert dashboard.post("pause", {"entry": "held"}, secret=SECRET, Origin="http://evil.example")[0] == 403
    assert dashboard.post("pause", {"entry": "held"}, secret=SECRET, Host="evil.example")[0] == 403
    assert all(e["paused"] is None for e in dashboard.state()["entries"])
    status, body = dashboard.post("pause", {"entry": "nope"}, secret=SECRET)
    assert status == 404 and "nope" in body["error"]
    status, body = dashboard.post("pause", {"entry": "held", "note": "two\nlines"}, secret=SECRET)
    assert status == 409 and "control characters" in body["error"]
    assert dashboard.post("pause", {"entry": "held", "note": "ok"}, secret=SECRET)[0] == 200


def test_a_hostile_entry_name_is_shown_as_text_and_runs_no_script(
    start: Callable[..., tuple[Cluster, Dashboard]],
) -> None:
    """An entry named with markup, a script, control characters and 1,000 characters is text on the page."""
    cluster, dashboard = start(schedule={"tick": 1, HOSTILE: 1})
    wait_for(lambda: any(p.entry == HOSTILE for p in cluster.publishes()), timeout=20, message=cluster.logs)
    assert dashboard.post("pause", {"entry": HOSTILE, "note": '<img src=x onerror="window.__pwned=3">'},
                          secret=SECRET)[0] == 200  # fmt: skip
    with browser_page() as page:
        open_page(page, dashboard)
        wait_for(lambda: has_row(page, HOSTILE), timeout=10)
        hostile = row(page, HOSTILE)
        wait_for(lambda: row(page, HOSTILE).query_selector(".pause-note") is not None, timeout=10)
        assert hostile.query_selector(".name").text_content() == printable(HOSTILE)
        assert len(HOSTILE) == 1000 and "\\u0007" in printable(HOSTILE)
        assert (
            row(page, HOSTILE).query_selector(".pause-note").text_content() == '<img src=x onerror="window.__pwned=3">'
        )
        assert page.evaluate("window.__pwned") is None
        assert page.evaluate("document.querySelectorAll('img').length") == 0
        assert page.evaluate("document.scripts.length") == 1  # app.js alone
        page.fill("#filter", "<script>")
        wait_for(lambda: page.eval_on_selector_all("#entries tbody tr", "trs => trs.length") == 1, timeout=5)
        assert page.evaluate("window.__pwned") is None


def _facts(candidate: dict[str, Any]) -> dict[str, Any]:
    keys = ("epoch", "znode", "identity", "host", "pid", "started_at", "version", "leader_since", "readable")
    return {key: candidate[key] for key in keys}


def test_the_json_api_says_what_status_json_says(start: Callable[..., tuple[Cluster, Dashboard]]) -> None:
    """Leader, candidates in order and each entry's ledger facts are the same in /api/state as in status --json."""
    paris_env, paris_words = paris()
    cluster, dashboard = start(extra_env=paris_env)
    cli = {"env": dict(cluster.env)}
    wait_for(lambda: len(dashboard.state()["shards"][0]["candidates"]) == 3, timeout=30)
    # Hold the ledger still: a paused entry's ticks write nothing, a run-now once.
    for name in ("tick", "held"):
        assert (
            zkbeat("-A", "tests.support.beatapp", "pause", name, "--note", "for the comparison", **cli).returncode == 0
        )
    assert zkbeat("-A", "tests.support.beatapp", "trigger", "hourly", **cli).returncode == 0

    def both() -> tuple[dict, dict] | None:
        status = json.loads(zkbeat("-A", "tests.support.beatapp", "status", "--json", "--all", **cli).stdout)
        api = dashboard.state()
        same_entries = {
            e["name"]: (e["total_run_count"], e["epoch"], e["manual"], e["paused"]) for e in status["entries"]
        }
        seen_entries = {e["name"]: (e["total_run_count"], e["epoch"], e["manual"], e["paused"]) for e in api["entries"]}
        return (status, api) if same_entries == seen_entries else None

    status, api = wait_for(both, timeout=15)
    shard = api["shards"][0]
    assert _facts(shard["leader"]) == _facts(status["leader"])
    assert [_facts(c) for c in shard["candidates"]] == [_facts(c) for c in status["candidates"]]
    assert shard["strangers"] == status["strangers"]
    assert api["root"] == status["root"] and api["hosts"] == status["hosts"]
    mine = {e["name"]: e for e in api["entries"]}
    assert set(mine) == {e["name"] for e in status["entries"]} == set(SCHEDULE) | {"report"}
    for theirs in status["entries"]:
        entry = mine[theirs["name"]]
        for key in ("last_run_at", "total_run_count", "epoch", "slot", "readable", "paused", "manual", "recent_runs"):
            assert entry[key] == theirs[key], (theirs["name"], key, entry[key], theirs[key])
        if theirs["next_due"] and not entry["paused"] and not entry["next"][0]["due"]:
            # (For a tick already due, status says "now" and the page names the slot that is due.)
            theirs_due, mine_due = datetime.fromisoformat(theirs["next_due"]), datetime.fromisoformat(entry["next_due"])
            assert abs((theirs_due - mine_due).total_seconds()) < 1, (theirs["name"], theirs_due, mine_due)
    assert mine["hourly"]["last_run"]["kind"] == "manual"
    # Recent runs, newest first, as `zkbeat history` reads them from the same ledger records.
    assert [run["kind"] for run in mine["hourly"]["recent_runs"]] == ["manual"]
    assert mine["hourly"]["recent_runs"][0]["replica"] == mine["hourly"]["by"]
    assert mine["tick"]["recent_runs"] and mine["report"]["recent_runs"] == []
    history = json.loads(zkbeat("-A", "tests.support.beatapp", "history", "tick", "--json", **cli).stdout)
    assert history["runs"] == mine["tick"]["recent_runs"]
    assert mine["tick"]["schedule"] == "every 1 s" and mine["hourly"]["schedule"] == "every 1 h"
    assert mine["report"]["schedule"] == paris_words and mine["report"]["last_run"] is None
    assert {e["catchup"] for e in api["entries"]} == {"once"}
    assert all(len(e["next"]) == 5 for e in api["entries"])
    assert api["shards"][0]["leader"]["identity"] == cluster.leader().identity


#: Entries of the sharded cluster: enough that each of 3 shards holds some ("tick" is the one start() waits for).
SHARDED = {"tick": 1, **{f"job-{i}": 1 for i in range(8)}}


def shown_shards(page: Any) -> dict[int, tuple[str, str]]:
    """{shard: (leader identity, epoch)} as the page's shard table shows them."""
    rows = page.eval_on_selector_all(
        "#shards tbody tr", "trs => trs.map(tr => [tr.dataset.shard, tr.querySelector('.identity').textContent, "
        "tr.dataset.epoch])",
    )  # fmt: skip
    return {int(shard): (identity, epoch) for shard, identity, epoch in rows}


def status_shards(cluster: Cluster) -> dict[int, tuple[str, str]]:
    """{shard: (leader identity, epoch)} as ``zkbeat status --json`` says them ("" for a shard without a leader)."""
    found = json.loads(zkbeat("-A", "tests.support.beatapp", "status", "--json", env=dict(cluster.env)).stdout)
    return {
        s["shard"]: (s["leader"]["identity"], str(s["leader"]["epoch"])) if s["leader"] else ("", "")
        for s in found["shards"]
    }


def agreed(page: Any, cluster: Cluster) -> dict[int, tuple[str, str]] | None:
    """The shards' leaders once the page and status --json say the same, every shard led."""
    theirs = status_shards(cluster)
    mine = shown_shards(page)
    return mine if mine == theirs and all(identity for identity, _ in mine.values()) else None


def test_with_three_shards_the_page_shows_each_shard_s_leader_and_a_kill_moves_one_without_a_reload(
    start: Callable[..., tuple[Cluster, Dashboard]], zk_client: KazooClient
) -> None:
    """3 shards on 3 replicas: the page names each shard's leader as status --json does, and each entry's shard;
    after kill -9 of one shard's leader the page shows that shard's new leader by itself."""
    cluster, dashboard = start(schedule=SHARDED, extra_env=shards_env(3))
    root = cluster.root
    led = wait_settled(zk_client, cluster, 3)
    with browser_page() as page:
        open_page(page, dashboard)
        assert page.is_hidden("#leader") and page.is_visible("#shards")
        shown = wait_for(lambda: agreed(page, cluster), timeout=30, message=lambda: str(shown_shards(page)))
        assert {shard: identity for shard, (identity, _) in shown.items()} == led
        texts = page.eval_on_selector_all("#shards tbody tr", "trs => trs.map(tr => tr.children[0].textContent)")
        assert texts == ["0/3", "1/3", "2/3"]
        # Each shard's line: all three replicas, its leader first.
        for shard in range(3):
            line = page.eval_on_selector_all(
                f"#shards tbody tr[data-shard='{shard}'] .line li", "items => items.map(li => li.textContent)"
            )
            assert line[0] == led[shard] and sorted(line) == sorted(r.identity for r in cluster.replicas), line
        # Each entry's shard, in the JSON and on the page, is the one its leader runs it in.
        entries = dashboard.state()["entries"]
        assert {e["name"]: e["shard"] for e in entries} == {name: shard_of(root, name, 3) for name in SHARDED}
        assert len({e["shard"] for e in entries}) > 1
        wait_for(lambda: has_row(page, "job-7"), timeout=10)
        for name in SHARDED:
            assert row(page, name).query_selector(".shard").text_content() == f"{shard_of(root, name, 3)}/3"

        page.evaluate("window.__still_this_page = true")  # gone if the page were reloaded
        shard, (identity, epoch) = sorted(shown.items())[1]
        victim = next(r for r in cluster.replicas if r.identity == identity)
        # Its follower in that shard watches its liveness socket before the kill (else only the session ends it).
        path = election_path(root, shard, 3)
        name = next(
            c.name for c in CandidateReader(zk_client, path).read().candidates if c.data.get("pid") == victim.pid
        )
        watched = f"watching the liveness of {path}/{name} at "
        wait_for(lambda: any(watched in r.log() for r in cluster.replicas if r is not victim), timeout=30)
        victim.signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            lambda: shown_shards(page)[shard][0] not in (identity, "") and shown_shards(page)[shard][1] != epoch,
            timeout=15,
            message=lambda: f"the page still shows {shown_shards(page)}",
        )
        print(f"the page showed shard {shard}'s new leader {time.monotonic() - killed:.2f} s after kill -9")
        assert page.evaluate("window.__still_this_page") is True
        # And it is the one status names (once the fair share has settled on the two replicas left).
        after = wait_for(lambda: agreed(page, cluster), timeout=30, message=lambda: str(shown_shards(page)))
        assert identity not in {who for who, _ in after.values()}, after

        # An identity in a shard's line is text too: a candidate (made as zkbeat names them) with markup for one.
        hostile = '<img src=x onerror="window.__pwned=4">\u202e\x07'
        zk_client.create(
            f"{election_path(root, 0, 3)}/candidate-{uuid.uuid4().hex}-",
            json.dumps({"identity": hostile}).encode(),
            ephemeral=True,
            sequence=True,
        )

        def line_of_shard_0() -> list[str]:
            return page.eval_on_selector_all(
                "#shards tbody tr[data-shard='0'] .line li", "items => items.map(li => li.textContent)"
            )

        wait_for(lambda: printable(hostile) in line_of_shard_0(), timeout=15, message=lambda: str(line_of_shard_0()))
        assert page.evaluate("window.__pwned") is None
        assert page.evaluate("document.querySelectorAll('img').length") == 0
