// The runs list, live: /ws/runs/?team=<id>&<filters> (console/runs/consumers.py
// RunListConsumer) sends a snapshot of every row, then {type: "rows", seq, rows: [{id, html,
// ...}], removed: [ids]} when a run of the team changes (created, state, each step's
// metrics). Rows are rendered by the server (the "row" partial of runs/run_list.html); a page
// that reconnects gets a fresh snapshot. Changing a filter swaps #results (htmx) and opens a
// socket with the new filters.
(function () {
  "use strict";
  let socket = null;
  let wsPath = null;
  let seq = 0;
  let backoff = 1000;
  let stopped = false;
  const statusEl = document.getElementById("list-status");

  function say(text) { if (statusEl) statusEl.textContent = text; }

  function rowFrom(html) {
    const tbody = document.createElement("tbody");
    tbody.innerHTML = html.trim();
    return tbody.firstElementChild;
  }

  function place(body, row) {
    const old = document.getElementById(row.id);
    if (old) {
      const box = old.querySelector("input[type=checkbox]");
      const fresh = row.querySelector("input[type=checkbox]");
      if (box && fresh) fresh.checked = box.checked;
      old.replaceWith(row);
    } else {
      body.prepend(row);
    }
  }

  function onMessage(msg) {
    if (msg.seq !== seq + 1) { socket.close(4000, "sequence gap"); return; }
    seq = msg.seq;
    const body = document.getElementById("run-rows");
    if (!body) return;
    if (msg.type === "snapshot") {
      const keep = new Set([...body.querySelectorAll("input[type=checkbox]:checked")].map((b) => b.value));
      const rows = msg.rows.map((r) => rowFrom(r.html));
      if (rows.length) {
        body.replaceChildren(...rows);
        for (const box of body.querySelectorAll("input[type=checkbox]")) box.checked = keep.has(box.value);
      }
    } else {
      for (const r of msg.rows) place(body, rowFrom(r.html));
      for (const id of msg.removed) { const old = document.getElementById(`run-row-${id}`); if (old) old.remove(); }
    }
    const empty = body.querySelector("tr.empty");
    if (empty && body.querySelector("tr[data-run]")) empty.remove();
    window.runListSeq = seq;
    say(`live · ${new Date().toLocaleTimeString()}`);
  }

  function connect() {
    const results = document.getElementById("results");
    if (!results) return;
    wsPath = results.dataset.ws;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    seq = 0;
    const mine = new WebSocket(`${scheme}://${location.host}${wsPath}`);
    socket = mine;
    mine.onopen = () => { backoff = 1000; window.runListOpen = true; };
    mine.onmessage = (e) => { if (socket === mine) onMessage(JSON.parse(e.data)); };
    mine.onclose = (e) => {
      if (socket !== mine) return; // replaced after a filter change
      window.runListOpen = false;
      if (stopped) return;
      if ([4401, 4403, 4404, 1007].includes(e.code)) { say("(not live)"); return; }
      say(`reconnecting in ${Math.round(backoff / 1000)} s…`);
      setTimeout(() => { if (socket === mine) connect(); }, backoff);
      backoff = Math.min(backoff * 2, 30000);
    };
  }

  document.body.addEventListener("htmx:afterSwap", (e) => {
    const results = document.getElementById("results");
    if (!results || results.dataset.ws === wsPath) return;
    const old = socket;
    socket = null;
    if (old) old.close();
    connect();
  });
  window.addEventListener("pagehide", () => { stopped = true; if (socket) socket.close(); });
  connect();
})();
