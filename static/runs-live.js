// A run's page, live: charts (uPlot), event markers, the state badge and a trajectory feed, fed
// by the websocket /ws/runs/<id>/ (console/runs/consumers.py). The server sends a snapshot,
// then deltas {type, seq, state, reason, last_step, max_steps, series: {key: [[step, value]]},
// events: [{id, kind, step, reason, at}], trajectories: [...newest first], cursors,
// truncate_after?}. After a lost connection the page reconnects with ?resume=1 and sends
// {type: "resume", since: cursors} (the last cursors it received): it gets exactly what it
// missed. While the socket is open the htmx poll of #run-live is held back and the part is
// refreshed only when the socket reports a change of state or an event; when the socket
// cannot open, the poll goes on as before.
(function () {
  "use strict";
  const root = document.getElementById("live");
  if (!root || typeof uPlot === "undefined" || !window.RunCharts) return;
  const wsPath = root.dataset.ws;
  const livePartUrl = root.dataset.livePart;
  const FEED_MAX = 50;
  const { CHARTS } = window.RunCharts; // static/runs-charts.js: charts, smoothing, log scale

  const data = new Map(); // key -> Map(step -> value)
  let events = []; // markers
  const charts = new Map(); // chart id -> {plot, keys, el}
  let cursors = null;
  let seq = 0;
  let socket = null;
  let backoff = 1000;
  let stopped = false;
  let drawPending = false;

  const statusEl = document.getElementById("live-status");
  const chartsEl = document.getElementById("live-charts");
  const feedEl = document.getElementById("live-feed");

  function say(text) { if (statusEl) statusEl.textContent = text; }

  // --- data -------------------------------------------------------------------------------
  function reset() {
    data.clear();
    events = [];
    if (feedEl) feedEl.textContent = "";
  }

  function addSeries(series) {
    for (const [key, points] of Object.entries(series || {})) {
      let m = data.get(key);
      if (!m) { m = new Map(); data.set(key, m); }
      for (const [step, value] of points) m.set(step, value);
    }
  }

  function truncate(after) {
    for (const m of data.values()) for (const step of [...m.keys()]) if (step > after) m.delete(step);
    events = events.filter((e) => e.step === null || e.step <= after || e.kind === "run.started");
    if (feedEl) for (const li of [...feedEl.children]) if (Number(li.dataset.step) > after) li.remove();
  }

  // --- charts -----------------------------------------------------------------------------
  function markersPlugin() { return window.RunCharts.markers(() => events); }

  function chartData(keys) {
    const steps = new Set();
    for (const k of keys) for (const s of data.get(k).keys()) steps.add(s);
    const xs = [...steps].sort((a, b) => a - b);
    return [xs, ...keys.map((k) => { const m = data.get(k); return xs.map((s) => (m.has(s) ? m.get(s) : null)); })];
  }

  function width() { return Math.max(280, Math.min(560, (chartsEl.clientWidth || 600) / 2 - 16)); }

  function makeChart(def, keys) {
    let entry = charts.get(def.id);
    if (entry) entry.plot.destroy();
    else {
      const order = CHARTS.findIndex((c) => c.id === def.id);
      entry = window.RunCharts.figure(def, order, rebuild);
      const after = [...chartsEl.children].find((c) => Number(c.dataset.order) > order);
      chartsEl.insertBefore(entry.el, after || null);
      charts.set(def.id, entry);
    }
    entry.keys = keys;
    entry.plotEl.textContent = "";
    const [xs, ...ys] = chartData(keys);
    const { series, data: lines } = window.RunCharts.lines(keys, ys, def.id);
    const opts = window.RunCharts.options(def, width(), series, {
      cursor: { sync: { key: "run-live" } },
      plugins: [markersPlugin(), window.RunCharts.zoomSync(() => [...charts.values()].map((c) => c.plot).filter(Boolean))],
    });
    entry.plot = new uPlot(opts, [xs, ...lines], entry.plotEl);
    window.RunCharts.keepZoom(entry.plot);
  }

  function chartLines(def, keys) {
    const [xs, ...ys] = chartData(keys);
    return [xs, ...window.RunCharts.lines(keys, ys, def.id).data];
  }

  // A smoothing or log-scale change: every chart (or one) is built again from the held data.
  function rebuild(only) {
    for (const def of CHARTS) {
      const entry = charts.get(def.id);
      if (entry && (!only || only.id === def.id)) makeChart(def, entry.keys);
    }
    for (const entry of charts.values()) entry.el.dataset.points = String(entry.plot.data[0].length);
  }

  function draw() {
    drawPending = false;
    for (const def of CHARTS) {
      const keys = [...data.keys()].filter((k) => def.match(k) && data.get(k).size).sort();
      if (!keys.length) continue;
      const entry = charts.get(def.id);
      if (!entry || entry.keys.join("\n") !== keys.join("\n")) makeChart(def, keys);
      else {
        window.RunCharts.setData(entry.plot, chartLines(def, keys)); // the user's zoom stays
      }
    }
    for (const entry of charts.values()) entry.el.dataset.points = String(entry.plot.data[0].length);
    chartsEl.dataset.points = String([...data.values()].reduce((n, m) => n + m.size, 0));
  }

  function redraw() {
    if (!drawPending) { drawPending = true; requestAnimationFrame(draw); }
  }

  // --- facts and the feed -----------------------------------------------------------------
  let lastState = null;
  let refreshTimer = null;

  function refreshLivePart(delay) {
    // The attempts table, the trajectory count and the error live in #run-live (the htmx
    // partial): fetch it once after a change (at most one fetch pending).
    if (!window.htmx || !livePartUrl || refreshTimer !== null) return;
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      allowPoll = true;
      window.htmx.ajax("GET", livePartUrl, { target: "#run-live", swap: "outerHTML" });
    }, delay);
  }

  function facts(msg) {
    const badge = document.querySelector("#run-state .badge");
    if (badge && msg.state) {
      badge.className = `badge state-${msg.state}`;
      badge.textContent = msg.state.charAt(0).toUpperCase() + msg.state.slice(1);
    }
    const step = document.getElementById("run-step");
    if (step) step.textContent = `${msg.last_step}/${msg.max_steps}`;
    const bar = document.querySelector("#run-progress progress");
    if (bar) { bar.max = Math.max(msg.max_steps, 1); bar.value = msg.last_step; }
    const changed = lastState !== null && (lastState !== `${msg.state}|${msg.reason}`);
    lastState = `${msg.state}|${msg.reason}`;
    if (changed || (msg.type === "delta" && msg.events.length)) refreshLivePart(300);
    else if (msg.type === "delta" && msg.trajectories.length) refreshLivePart(3000);
  }

  function feed(trajectories) {
    if (!feedEl) return;
    for (const t of [...trajectories].reverse()) {
      const li = document.createElement("li");
      li.dataset.step = String(t.step);
      // Each entry opens its sample (chat, observations, reward breakdown, provenance).
      const head = document.createElement("a");
      head.href = `${location.pathname.replace(/\/?$/, "/")}trajectories/${t.step}/${t.index}/`;
      head.className = "feed-head";
      head.textContent = `step ${t.step} #${t.index} · ${t.domain} · reward ${Number(t.reward).toFixed(3)} · ${t.finish_reason}`;
      const body = document.createElement("code");
      body.textContent = t.completion;
      li.append(head, body);
      feedEl.prepend(li);
    }
    while (feedEl.children.length > FEED_MAX) feedEl.lastElementChild.remove();
    feedEl.dataset.count = String(feedEl.children.length);
  }

  // --- the socket -------------------------------------------------------------------------
  function onMessage(msg) {
    if (msg.seq !== seq + 1) { socket.close(4000, "sequence gap"); return; }
    seq = msg.seq;
    if (msg.type === "snapshot") reset();
    if (msg.truncate_after !== undefined) truncate(msg.truncate_after);
    addSeries(msg.series);
    events = events.concat(msg.events || []);
    feed(msg.trajectories || []);
    facts(msg);
    cursors = msg.cursors;
    window.runLiveOpen = true;
    say(`Live · updated ${new Date().toLocaleTimeString()}`);
    redraw();
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const resume = cursors !== null;
    seq = 0;
    socket = new WebSocket(`${scheme}://${location.host}${wsPath}${resume ? "?resume=1" : ""}`);
    socket.onopen = () => {
      backoff = 1000;
      if (resume) socket.send(JSON.stringify({ type: "resume", since: cursors }));
    };
    socket.onmessage = (e) => onMessage(JSON.parse(e.data));
    socket.onclose = (e) => {
      window.runLiveOpen = false;
      if (stopped) return;
      if ([4401, 4403, 4404, 1007].includes(e.code)) { say("Live updates are not available (polling instead)."); return; }
      say(`Reconnecting in ${Math.round(backoff / 1000)} s (polling meanwhile)…`);
      setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 30000);
    };
  }

  // Hold back the htmx poll of #run-live while the socket is open (the poll stays the
  // fallback), except for the refreshes the socket asks for.
  let allowPoll = false;
  document.body.addEventListener("htmx:beforeRequest", (e) => {
    const target = e.detail && e.detail.elt;
    if (!target || target.id !== "run-live") return;
    if (window.runLiveOpen && !allowPoll) e.preventDefault();
    allowPoll = false;
  });
  window.addEventListener("resize", () => { for (const c of charts.values()) c.plot.setSize({ width: width(), height: 220 }); });
  window.addEventListener("pagehide", () => { stopped = true; if (socket) socket.close(); });
  // Tests reach the socket through this (e.g. to kill it and watch the page resume).
  window.RunCharts.smoothingControl(document.getElementById("chart-controls"), () => rebuild(null));
  window.runLive = {
    close: () => socket && socket.close(),
    points: () => [...data.values()].reduce((n, m) => n + m.size, 0),
    plot: (id) => charts.get(id).plot,
    chart: (id) => { const c = charts.get(id); return c && { series: c.plot.series.length - 1, distr: c.plot.scales.y.distr, x: [c.plot.scales.x.min, c.plot.scales.x.max] }; },
  };
  connect();
})();
