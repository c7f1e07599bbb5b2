// zkbeat dashboard: follows /api/events and draws the cluster and its entries.
// Every value from ZooKeeper (entry names, notes, identities) is user input:
// it is only ever written as text (textContent), never parsed as HTML, and
// control characters are shown escaped. No innerHTML anywhere in this file.
"use strict";

(function () {
  const MAX_ROWS = 200;
  const state = { cluster: null, entries: new Map(), controls: false, seq: 0, root: "", hosts: "", app: false };
  const rows = new Map(); // entry name -> {tr, cells, note}
  let drawPending = false;

  const $ = (id) => document.getElementById(id);

  // Control and format characters as \uXXXX: a name must not forge a line or hide its tail.
  function printable(value) {
    if (value === null || value === undefined) return "";
    return String(value).replace(/[\p{Cc}\p{Cf}\u2028\u2029]/gu, (ch) =>
      "\\u" + ch.codePointAt(0).toString(16).padStart(4, "0"));
  }

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = printable(text);
    if (className) node.className = className;
    return node;
  }

  function span(seconds) {
    const s = Math.abs(seconds);
    if (s >= 86400) return (s / 86400).toFixed(1) + " d";
    if (s >= 3600) return (s / 3600).toFixed(1) + " h";
    if (s >= 60) return (s / 60).toFixed(1) + " min";
    return s.toFixed(s < 10 ? 1 : 0) + " s";
  }

  function when(iso) {
    if (!iso) return "–";
    const t = Date.parse(iso);
    if (isNaN(t)) return printable(iso);
    const d = (Date.now() - t) / 1000;
    const stamp = new Date(t).toISOString().replace("T", " ").slice(0, 19) + "Z";
    return stamp + (d >= 0 ? " (" + span(d) + " ago)" : " (in " + span(d) + ")");
  }

  // UTC time of day, with the date when it is not today's.
  function shortTime(iso) {
    const t = Date.parse(iso);
    if (isNaN(t)) return "?";
    const stamp = new Date(t).toISOString();
    const today = new Date().toISOString().slice(0, 10);
    return (stamp.slice(0, 10) === today ? "" : stamp.slice(5, 10) + " ") + stamp.slice(11, 19);
  }

  function message(text, isError) {
    const box = $("message");
    box.hidden = !text;
    box.textContent = printable(text || "");
    box.className = isError ? "error" : "";
  }

  // -- events --------------------------------------------------------------

  function apply(data) {
    if (data.full) state.entries.clear();
    for (const entry of data.entries || []) state.entries.set(entry.name, entry);
    for (const name of data.removed || []) state.entries.delete(name);
    state.cluster = data;
    state.controls = !!data.controls;
    state.seq = data.seq;
    state.root = data.root;
    state.hosts = data.hosts;
    state.app = data.app;
    scheduleDraw();
  }

  function connect() {
    const source = new EventSource("/api/events");
    source.onmessage = (event) => apply(JSON.parse(event.data));
    source.onerror = () => setConnection("dashboard unreachable", false);
  }

  function scheduleDraw() {
    if (drawPending) return;
    drawPending = true;
    requestAnimationFrame(() => { drawPending = false; draw(); });
  }

  // -- drawing -------------------------------------------------------------

  function setConnection(text, ok) {
    const badge = $("connection");
    badge.textContent = printable(text);
    badge.className = "badge " + (ok ? "ok" : "bad");
  }

  function draw() {
    const c = state.cluster;
    if (!c) return;
    $("where").textContent = printable(state.root + " on " + state.hosts);
    setConnection("ZooKeeper " + c.connection, c.connection === "CONNECTED");
    $("updated").textContent = "seq " + c.seq;
    const error = $("cluster-error");
    error.hidden = !c.error;
    error.textContent = printable(c.error || "");
    drawCluster(c);
    drawEntries();
  }

  // Who a candidate is, as text: its identity, or why it has none to show.
  function who(cand) {
    return cand.identity || (cand.readable ? "?" : "<unreadable data>");
  }

  function drawCluster(c) {
    const shards = c.shards || [];
    const sharded = shards.length > 1;
    const shard = shards[0] || { candidates: [], strangers: [] };
    const leader = shard.leader || shard.head;
    const box = $("leader");
    box.hidden = sharded;
    box.dataset.epoch = shard.leader ? String(shard.leader.epoch) : "";
    box.querySelector(".identity").textContent = leader ? printable(leader.identity || leader.znode) : "none";
    box.querySelector(".detail").textContent = leader
      ? printable((shard.leader ? "epoch " + leader.epoch : "sequence " + leader.sequence) + ", host " + (leader.host || "?") + ", pid " + (leader.pid || "?") +
        (shard.leader ? ", leading since " + when(leader.leader_since) : ", head of the line, not leading yet"))
      : "no replica is in the election";
    drawShards(shards);
    $("candidates-epoch").textContent = sharded ? "leads" : "epoch";
    const body = $("candidates").querySelector("tbody");
    body.replaceChildren();
    for (const cand of sharded ? replicas(shards) : shard.candidates) {
      const tr = el("tr");
      if (sharded ? cand.leads.length : cand.place === 1) tr.className = "head-row";
      const live = cand.liveness ? cand.liveness.host + ":" + cand.liveness.port : "–";
      let epoch = sharded ? cand.leads.join(", ") : cand.epoch === null ? "" : cand.epoch;
      if (cand.unready) {
        // It said it cannot lead now (its schedule did not load as leader): the fair share hands it no shard.
        tr.classList.add("unready");
        epoch = (epoch ? epoch + "; " : "") + printable("not ready to lead: " + cand.unready);
      }
      const since = sharded || !cand.leader_since ? "" : when(cand.leader_since);
      for (const value of [cand.place, epoch, who(cand), cand.host, cand.pid, cand.version, cand.layout, live,
        when(cand.started_at), since]) {
        tr.appendChild(el("td", value === null || value === undefined ? "–" : value));
      }
      body.appendChild(tr);
    }
    // A replica marked unready that is in no line (it stepped aside a while): in the table all the same.
    for (const mark of sharded ? (c.unready || []).filter((m) => !m.in_line) : []) {
      const tr = el("tr", null, "unready out-of-line");
      const note = "not ready to lead: " + mark.why + "; in no line; since " + when(mark.since);
      for (const value of [null, note, mark.identity || "replica " + mark.replica, mark.host, mark.pid, null, null,
        null, null, null]) {
        tr.appendChild(el("td", value === null || value === undefined ? "–" : value));
      }
      body.appendChild(tr);
    }
    const strangers = $("strangers");
    const ignored = shards.flatMap((s) => s.strangers || []);
    strangers.hidden = !ignored.length;
    strangers.textContent = printable("ignored in the election: " + ignored.join("; "));
    const epochs = c.epochs || {};
    $("observed-title").textContent = sharded ? "Leaders of shard 0 this dashboard has seen"
      : "Leaders this dashboard has seen";
    $("epoch-counters").textContent = printable(
      (sharded ? "Each shard numbers its own candidates. In shard 0's election, e" : "E") +
      "pochs are the candidates' sequence numbers; the next replica to join gets " +
      (epochs.next === null || epochs.next === undefined ? "?" : epochs.next) +
      " or more. Leaders announced " + (sharded ? "in it: " : "on this root: ") + (epochs.takeovers === null || epochs.takeovers === undefined
        ? "?" : epochs.takeovers) + ".");
    const observed = $("observed").querySelector("tbody");
    observed.replaceChildren();
    for (const row of (epochs.observed || []).slice().reverse()) {
      const tr = el("tr");
      for (const v of [row.epoch, row.identity || "?", row.leader_since ? when(row.leader_since) : "–",
        when(row.seen_at), row.until ? when(row.until) : "leading"]) tr.appendChild(el("td", v));
      observed.appendChild(tr);
    }
    const ledger = $("ledger-epochs").querySelector("tbody");
    ledger.replaceChildren();
    for (const row of epochs.ledger || []) {
      const tr = el("tr");
      tr.appendChild(shardCell(row.shard, shards.length));
      for (const v of [row.epoch, row.identity || "?", row.entries, when(row.last_at)]) tr.appendChild(el("td", v));
      ledger.appendChild(tr);
    }
    for (const th of document.querySelectorAll("th.shard-col")) th.hidden = !sharded;
    const layout = c.layout || {};
    $("layout").textContent = printable("Layout: this release " + layout.this_release + "; the root holds " +
      ((layout.found || []).join(", ") || "nothing yet") + (layout.newer && layout.newer.length
        ? " (newer than this release: " + layout.newer.join(", ") + ")" : ""));
  }

  // "k/N", in a cell shown only when there are several shards.
  function shardCell(shard, count) {
    const td = el("td", count > 1 ? shard + "/" + count : "", "shard");
    td.hidden = count <= 1;
    return td;
  }

  // With several shards: one row per shard, its leader (or the head that has not said it leads yet) and its line.
  function drawShards(shards) {
    const table = $("shards");
    table.hidden = shards.length <= 1;
    const body = table.querySelector("tbody");
    body.replaceChildren();
    if (table.hidden) return;
    for (const s of shards) {
      const tr = el("tr");
      const lead = s.leader || s.head;
      tr.dataset.shard = String(s.shard);
      tr.dataset.epoch = s.leader ? String(s.leader.epoch) : "";
      tr.appendChild(el("td", s.shard + "/" + shards.length));
      const cell = el("td");
      cell.appendChild(el("span", lead ? who(lead) : "none", "identity"));
      if (lead && !s.leader) cell.appendChild(el("span", " (head of the line, not leading yet)", "note"));
      tr.appendChild(cell);
      tr.appendChild(el("td", s.leader ? s.leader.epoch : "–"));
      tr.appendChild(el("td", s.leader ? when(s.leader.leader_since) : "–"));
      const line = el("ol", null, "line");
      for (const cand of s.candidates) line.appendChild(el("li", who(cand)));
      const lineCell = el("td");
      lineCell.appendChild(s.candidates.length ? line : el("span", "nobody", "note"));
      if ((s.strangers || []).length) lineCell.appendChild(el("div", s.strangers.length + " ignored", "note"));
      tr.appendChild(lineCell);
      body.appendChild(tr);
    }
  }

  // Each replica once (every replica is in every shard's line), in the order of shard 0's line, then
  // the others', with the shards it leads ("k/N (epoch E)").
  function replicas(shards) {
    const found = new Map();
    for (const s of shards) {
      for (const cand of s.candidates) {
        const key = JSON.stringify([cand.identity, cand.pid, cand.host]);
        if (!found.has(key)) found.set(key, Object.assign({}, cand, { place: found.size + 1, leads: [] }));
        if (s.leader && s.leader.znode === cand.znode) {
          found.get(key).leads.push(s.shard + "/" + shards.length + " (epoch " + cand.epoch + ")");
        }
      }
    }
    return Array.from(found.values());
  }

  function visibleEntries() {
    const needle = $("filter").value.trim().toLowerCase();
    const names = Array.from(state.entries.keys()).sort();
    const matches = needle ? names.filter((n) => printable(n).toLowerCase().includes(needle)) : names;
    return { shown: matches.slice(0, MAX_ROWS), total: matches.length };
  }

  function drawEntries() {
    const { shown, total } = visibleEntries();
    $("entry-count").textContent = "(" + state.entries.size + (total !== state.entries.size
      ? ", " + total + " match" : "") + ")";
    const more = $("more");
    more.hidden = total <= shown.length;
    more.textContent = (total - shown.length) + " more: narrow the filter to see them";
    const controls = state.controls;
    $("controls-state").textContent = controls
      ? "controls on: pause, resume and run-now need the secret"
      : "read-only: start the dashboard with a secret to pause, resume or run now";
    $("controls-inputs").hidden = !controls;
    const body = $("entries").querySelector("tbody");
    const wanted = new Set(shown);
    for (const [name, row] of rows) {
      if (!wanted.has(name)) { row.tr.remove(); rows.delete(name); }
    }
    let previous = null;
    for (const name of shown) {
      let row = rows.get(name);
      if (!row) { row = makeRow(name); rows.set(name, row); }
      fillRow(row, state.entries.get(name), controls);
      const expected = previous ? previous.nextSibling : body.firstChild;
      if (expected !== row.tr) body.insertBefore(row.tr, expected);
      previous = row.tr;
    }
  }

  function makeRow(name) {
    const tr = el("tr");
    tr.dataset.name = name; // an attribute value, never markup
    const cells = {};
    for (const key of ["name", "shard", "schedule", "last", "late", "recent", "next", "state", "pending", "catchup"]) {
      cells[key] = el("td");
      tr.appendChild(cells[key]);
    }
    cells.name.className = "name";
    cells.shard.className = "shard";
    cells.next.className = "fires";
    // Recent runs: one <details> kept across redraws, so an opened list stays open. A list, not a
    // table: the entries table's rows stay the only rows under #entries.
    const recent = el("details", null, "recent");
    recent.append(el("summary"), el("ol", null, "runs"));
    cells.recent.appendChild(recent);
    const actions = el("td", null, "controls");
    const note = el("input");
    note.type = "text";
    note.placeholder = "note";
    note.maxLength = 1000;
    note.className = "note-input";
    const buttons = {};
    for (const [action, label] of [["pause", "pause"], ["resume", "resume"], ["run", "run now"]]) {
      const button = el("button", label, "action-" + action);
      button.type = "button";
      button.addEventListener("click", () => control(action, name, note));
      buttons[action] = button;
    }
    actions.append(note, buttons.pause, buttons.resume, buttons.run);
    tr.appendChild(actions);
    return { tr, cells, note, buttons, recent };
  }

  function fillRow(row, e, controls) {
    const c = row.cells;
    c.name.textContent = printable(e.name);
    c.name.title = printable(e.name);
    const count = (state.cluster.shards || []).length;
    c.shard.hidden = count <= 1;
    c.shard.textContent = count > 1 ? e.shard + "/" + count : "";
    c.schedule.textContent = printable(e.schedule || (state.app ? "not in the app's schedule" : "unknown (start with -A)"));
    const last = e.last_run;
    if (!e.readable) {
      c.last.textContent = "<unreadable ledger data>";
    } else if (last) {
      c.last.textContent = printable((last.kind === "manual" ? "run now " + last.manual : last.kind) +
        " at " + when(last.published_at) + ", slot " + (last.slot ? shortTime(last.slot) : "–") +
        ", epoch " + last.epoch + (e.by ? " (" + e.by + ")" : "") + ", runs " + e.total_run_count);
    } else {
      c.last.textContent = "never run";
    }
    c.late.textContent = last && last.late_seconds !== null ? span(last.late_seconds) : "–";
    fillRecent(row.recent, e.recent_runs || []);
    const fires = e.next || [];
    c.next.replaceChildren();
    fires.forEach((fire, i) => {
      const line = el("div", shortTime(fire.at) + (fire.at !== fire.slot ? " (slot " + shortTime(fire.slot) + ")" : ""));
      if (i === 0 && Date.parse(fire.at) < Date.now() - 1000) {
        line.className = e.paused ? "paused" : "overdue";
        line.textContent += e.paused ? " held" : " due, late " + span((Date.now() - Date.parse(fire.at)) / 1000);
      }
      c.next.appendChild(line);
    });
    if (!fires.length) c.next.textContent = "–";
    c.state.replaceChildren();
    if (e.paused) {
      c.state.appendChild(el("div", "paused", "paused"));
      c.state.appendChild(el("div", "by " + e.paused.by + " at " + when(e.paused.at)));
      if (e.paused.note) c.state.appendChild(el("div", e.paused.note, "pause-note"));
    } else {
      c.state.textContent = "active";
    }
    c.pending.textContent = (e.pending || []).length
      ? printable(e.pending.map((p) => p.request + " by " + p.by).join("; ")) : "–";
    c.catchup.textContent = printable(e.catchup || "–");
    for (const b of Object.values(row.buttons)) {
      b.disabled = !controls;
      b.title = controls ? "" : "controls are off: start the dashboard with a secret";
    }
    row.buttons.pause.hidden = !!e.paused;
    row.buttons.resume.hidden = !e.paused;
    row.note.hidden = !!e.paused;
  }

  // The entry's recent runs, newest first (its ledger keeps the last few: zkbeat.history).
  function fillRecent(details, runs) {
    details.querySelector("summary").textContent = runs.length
      ? runs.length + " run" + (runs.length === 1 ? "" : "s") + ", last " + runs[0].kind : "none";
    const list = details.querySelector("ol");
    list.replaceChildren();
    for (const run of runs) {
      const item = el("li", null, "run-" + run.kind);
      item.title = "slot " + run.slot + ", published " + run.at;
      const fields = [["slot", shortTime(run.slot)], ["late", "late " + span(run.late_seconds)],
        ["replica", run.replica], ["epoch", "epoch " + run.epoch], ["kind", run.kind]];
      for (const [name, text] of fields) item.appendChild(el("span", text, name));
      list.appendChild(item);
    }
  }

  // -- controls ------------------------------------------------------------

  async function control(action, name, noteInput) {
    const secret = $("secret").value;
    const operator = $("operator").value;
    sessionStorage.setItem("zkbeat-secret", secret);
    localStorage.setItem("zkbeat-operator", operator);
    const body = { entry: name };
    if (action === "pause") body.note = noteInput.value;
    let answer, data;
    try {
      answer = await fetch("/api/" + action, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-Zkbeat-Secret": secret, "X-Zkbeat-Operator": operator },
        body: JSON.stringify(body),
        credentials: "omit",
      });
      data = await answer.json();
    } catch (err) {
      message("the dashboard did not answer: " + err, true);
      return;
    }
    if (!answer.ok) {
      message(action + " " + name + ": refused (" + answer.status + "): " + (data.error || ""), true);
      return;
    }
    if (action === "pause") noteInput.value = "";
    message(action === "run" ? "asked to run " + name + " now (" + data.request + ")"
      : action + (data.changed ? "d " : ": nothing to do for ") + name, false);
  }

  // -- start -----------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("secret").value = sessionStorage.getItem("zkbeat-secret") || "";
    $("operator").value = localStorage.getItem("zkbeat-operator") || "";
    $("filter").addEventListener("input", scheduleDraw);
    setInterval(scheduleDraw, 1000); // "3 s ago" moves with the clock
    connect();
  });
})();
