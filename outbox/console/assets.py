"""The console's page shell, style sheet and script: served as they are, no build step.

The script fetches `/api/view` every few seconds and puts the HTML fragments the server
rendered (and escaped) into the page; it never builds HTML from data itself. The page's
Content-Security-Policy allows only these two files as script and style.
"""

from __future__ import annotations

CSS = """\
:root { --bad: #c92a2a; --muted: #868e96; --line: #dee2e6; }
* { box-sizing: border-box; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #212529; background: #f8f9fa; }
header { background: #212529; color: #f8f9fa; padding: 8px 16px; display: flex; gap: 16px;
         align-items: center; flex-wrap: wrap; }
header h1 { font-size: 16px; margin: 0; }
header a.db { color: #adb5bd; text-decoration: none; padding: 2px 8px; border-radius: 4px; }
header a.db.current { background: #495057; color: #fff; }
header a.db.down { color: #ffa8a8; }
header .down-mark { font-size: 11px; }
header .status { margin-left: auto; font-size: 12px; color: #adb5bd; }
header .ro { background: #f08c00; color: #000; padding: 1px 6px; border-radius: 4px; }
main { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 12px;
       padding: 12px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px;
          overflow-x: auto; }
section.wide { grid-column: 1 / -1; }
h2 { font-size: 15px; margin: 4px 0 8px; }
h3 { font-size: 13px; margin: 10px 0 4px; }
h4 { font-size: 12px; margin: 8px 0 2px; }
small { color: var(--muted); font-weight: normal; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid var(--line);
         vertical-align: top; }
td { overflow-wrap: anywhere; }
th { white-space: nowrap; }
thead th { background: #f1f3f5; }
.zero, .none, .age { color: var(--muted); }
.bad { color: var(--bad); font-weight: 600; }
.error { color: #862e9c; }
pre { background: #f1f3f5; padding: 6px; white-space: pre-wrap; word-break: break-all;
      max-height: 320px; overflow: auto; margin: 0; }
.state { font-size: 12px; padding: 1px 6px; border-radius: 4px; background: #e9ecef; }
.state.dead { background: #ffe3e3; color: var(--bad); }
.state.processed { background: #d3f9d8; color: #2b8a3e; }
form.filter { display: flex; gap: 8px; flex-wrap: wrap; margin-bottom: 8px; }
button { cursor: pointer; white-space: nowrap; }
td:has(> button) { white-space: nowrap; width: 1%; }
button.purge { color: var(--bad); }
.actions { margin: 6px 0; }
.legends { display: flex; flex-wrap: wrap; gap: 12px; font-size: 12px; }
#banner { display: none; background: #ffe3e3; color: var(--bad); padding: 6px 16px; }
#banner.shown { display: block; }
#message { font-weight: 600; }
.pager { margin: 6px 0; display: flex; gap: 8px; }
dialog { border: 1px solid var(--line); border-radius: 6px; }
header a.doc, header .status a { color: #adb5bd; }
.asyncapi { overflow-wrap: anywhere; }
.asyncapi .schema table { margin: 4px 0; }
.asyncapi .schema table table { font-size: 12px; }
.asyncapi .description { color: #495057; }
.asyncapi .operation { margin: 4px 0; }
.asyncapi details { margin: 4px 0 10px; }
.state.send { background: #d0ebff; color: #1864ab; }
.state.receive { background: #d3f9d8; color: #2b8a3e; }
"""

JS = """\
"use strict";
(function () {
  const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;
  const db = meta("outbox-db");
  const csrf = meta("outbox-csrf");
  const refresh = Number(meta("outbox-refresh")) * 1000;
  const $ = (id) => document.getElementById(id);
  let opened = null;  // {queue, id} of the row shown in the detail panel
  let pending = null; // {action, queue, id} awaiting confirmation
  let after = "";     // the page of dead letters shown: the id the page starts after

  function filters() {
    const f = $("filter");
    return new URLSearchParams({
      db: db, queue: f.queue.value, topic: f.topic.value, text: f.text.value, after: after,
    });
  }

  function banner(text) {
    $("banner").textContent = text || "";
    $("banner").classList.toggle("shown", Boolean(text));
  }

  async function getJson(url) {
    const response = await fetch(url, {headers: {"Accept": "application/json"}});
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  }

  async function load() {
    try {
      const shown = await getJson("/api/databases?" + new URLSearchParams({db: db}));
      $("databases").innerHTML = shown.html;
    } catch (error) {
      // The view's request below says why in the banner.
    }
    try {
      const view = await getJson("/api/view?" + filters());
      for (const part of ["queues", "processes", "lag", "chart", "dead"]) {
        $(part).innerHTML = view[part];
      }
      $("updated").textContent = "updated " + view.taken_at;
      banner(view.error);
      if (opened) await openRow(opened.queue, opened.id, false);
    } catch (error) {
      banner("cannot refresh: " + error.message);
    }
  }

  async function openRow(queue, id, scroll) {
    try {
      const body = await getJson(
        "/api/row?" + new URLSearchParams({db: db, queue: queue, id: id}));
      opened = {queue: queue, id: id};
      $("detail").innerHTML = body.html;
      $("detail-section").hidden = false;
      if (scroll) $("detail-section").scrollIntoView();
    } catch (error) {
      $("detail").textContent = error.message;
    }
  }

  async function act(action, queue, id) {
    const form = new URLSearchParams({db: db, queue: queue, id: id});
    const response = await fetch("/api/" + action, {
      method: "POST",
      headers: {"X-CSRF-Token": csrf, "Content-Type": "application/x-www-form-urlencoded"},
      body: form,
    });
    const body = await response.json();
    $("message").textContent = response.ok ? body.message : "refused: " + body.error;
    if (response.ok && action === "purge") {
      opened = null;
      $("detail").textContent = "";
    }
    await load();
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button");
    if (!button) return;
    if (button.classList.contains("page")) {
      after = button.dataset.after;
      load();
    } else if (button.classList.contains("open")) {
      $("message").textContent = "";
      openRow(button.dataset.queue, button.dataset.id, true);
    } else if (button.classList.contains("act")) {
      pending = {action: button.dataset.action, queue: button.dataset.queue,
                 id: button.dataset.id};
      $("confirm-text").textContent =
        `${pending.action} row ${pending.id} of ${pending.queue}_queue?` +
        (pending.action === "purge" ? " It is deleted for good." : "");
      $("confirm-ok").textContent = pending.action;
      $("confirm").showModal();
    }
  });

  $("confirm").addEventListener("close", () => {
    const chosen = pending;
    pending = null;
    if (chosen && $("confirm").returnValue === "ok") act(chosen.action, chosen.queue, chosen.id);
  });

  $("filter").addEventListener("submit", (event) => {
    event.preventDefault();
    after = "";
    load();
  });
  $("filter").queue.addEventListener("change", () => { after = ""; load(); });
  load();
  setInterval(load, refresh);
})();
"""

#: The page; `{...}` fields are filled (escaped) by the server.
PAGE = """\
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>outbox console: {db}</title>
<meta name="outbox-db" content="{db}">
<meta name="outbox-csrf" content="{csrf}">
<meta name="outbox-refresh" content="{refresh}">
<link rel="stylesheet" href="/static/console.css">
<script src="/static/console.js" defer></script>
</head>
<body>
<header>
<h1>outbox console</h1>
<nav id="databases">{databases}</nav>
{read_only}{asyncapi}
<span class="status"><span title="{described}">schema {schema}</span> ·
<span id="updated">loading…</span></span>
</header>
<div id="banner" role="alert"></div>
<main>
<section class="wide"><h2>Queues</h2><div id="queues"></div></section>
<section><h2>Processes</h2><div id="processes"></div></section>
<section><h2>Consumer-group lag</h2><div id="lag"></div></section>
<section class="wide"><h2>Throughput <small>rows per second, sampled by the console</small></h2>
<div id="chart"></div></section>
<section class="wide"><h2>Dead letters</h2>
<form id="filter" class="filter">
<label>queue <select name="queue"><option value="consumer">consumer (inbox)</option>
<option value="producer">producer (outbox)</option></select></label>
<label>topic <input name="topic" placeholder="any topic" size="24"></label>
<label>text <input name="text" placeholder="id, message id, key or error" size="32"></label>
<button type="submit">filter</button>
</form>
<div id="dead"></div></section>
<section class="wide" id="detail-section" hidden><h2>Dead letter</h2>
<p id="message" role="status"></p><div id="detail"></div></section>
</main>
<dialog id="confirm"><form method="dialog"><p id="confirm-text"></p>
<button value="cancel">cancel</button> <button value="ok" id="confirm-ok">ok</button>
</form></dialog>
</body>
</html>
"""
