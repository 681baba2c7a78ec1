// The compare page: several runs' series (embedded by the server as JSON in #compare-data,
// min/max downsampled per run; also GET /api/runs/compare?ids=…) overlaid on one chart per
// metric group, one colour per run, with the run page's smoothing and log-scale controls
// (static/runs-charts.js), a shared cursor, drag-to-zoom (kept when points arrive) and each
// run's events as markers in its colour. Live: each compared run's own stream
// (/ws/runs/<id>/, the run page's: a snapshot, then deltas with sequence numbers; after a lost
// connection it resumes from its cursors) adds its new points and events.
(function () {
  "use strict";
  const source = document.getElementById("compare-data");
  const chartsEl = document.getElementById("compare-charts");
  if (!source || !chartsEl || typeof uPlot === "undefined" || !window.RunCharts) return;
  const { CHARTS, COLORS } = window.RunCharts;
  const runs = JSON.parse(source.textContent).map((run, r) => ({
    ...run,
    r,
    color: COLORS[r % COLORS.length],
    data: new Map(Object.entries(run.series).map(([k, pts]) => [k, new Map(pts)])),
    events: [],
  }));
  const charts = new Map();
  let drawPending = false;

  function width() { return Math.max(280, Math.min(560, (chartsEl.clientWidth || 600) / 2 - 16)); }

  // The lines of one chart: every (run, key) pair whose key the chart draws.
  function linesOf(def) {
    const pairs = [];
    for (const run of runs) {
      for (const key of [...run.data.keys()].sort()) if (def.match(key) && run.data.get(key).size) pairs.push({ run, key });
    }
    const steps = new Set();
    for (const p of pairs) for (const s of p.run.data.get(p.key).keys()) steps.add(s);
    const xs = [...steps].sort((a, b) => a - b);
    const ys = pairs.map((p) => {
      const m = p.run.data.get(p.key);
      return xs.map((s) => (m.has(s) ? m.get(s) : null));
    });
    const labels = pairs.map((p) => `${p.run.name} #${p.run.id} · ${p.key}`);
    return { pairs, xs, ys, labels };
  }

  function allEvents() {
    return runs.flatMap((run) => run.events.map((e) => ({ ...e, color: run.color, label: `${run.name} #${run.id}` })));
  }

  function build(def) {
    const { pairs, xs, ys, labels } = linesOf(def);
    if (!pairs.length) return;
    let entry = charts.get(def.id);
    if (entry) entry.plot.destroy();
    else {
      entry = window.RunCharts.figure(def, CHARTS.indexOf(def), (d) => build(d));
      const after = [...chartsEl.children].find((c) => Number(c.dataset.order) > CHARTS.indexOf(def));
      chartsEl.insertBefore(entry.el, after || null);
      charts.set(def.id, entry);
    }
    entry.plotEl.textContent = "";
    entry.labels = labels.join("\n");
    const { series, data } = window.RunCharts.lines(labels, ys, def.id, (i) => COLORS[pairs[i].run.r % COLORS.length]);
    const opts = window.RunCharts.options(def, width(), series, {
      cursor: { sync: { key: "run-compare" } },
      plugins: [window.RunCharts.markers(allEvents), window.RunCharts.zoomSync(() => [...charts.values()].map((c) => c.plot).filter(Boolean))],
    });
    entry.plot = new uPlot(opts, [xs, ...data], entry.plotEl);
    window.RunCharts.keepZoom(entry.plot);
    mark(entry, pairs, ys);
  }

  function mark(entry, pairs, ys) {
    entry.el.dataset.runs = String(new Set(pairs.map((p) => p.run.id)).size);
    entry.el.dataset.points = String(ys.reduce((n, y) => n + y.filter((v) => v !== null).length, 0));
  }

  // New points: a chart whose lines are the same gets them with setData (its zoom kept); one
  // that gained a line is built again.
  function draw() {
    drawPending = false;
    for (const def of CHARTS) {
      const entry = charts.get(def.id);
      const { pairs, xs, ys, labels } = linesOf(def);
      if (!pairs.length) continue;
      if (!entry || entry.labels !== labels.join("\n")) { build(def); continue; }
      const lines = window.RunCharts.lines(labels, ys, def.id, (i) => COLORS[pairs[i].run.r % COLORS.length]);
      window.RunCharts.setData(entry.plot, [xs, ...lines.data]);
      mark(entry, pairs, ys);
    }
    chartsEl.dataset.charts = String(charts.size);
  }
  function redraw() { if (!drawPending) { drawPending = true; requestAnimationFrame(draw); } }

  function buildAll() { for (const def of CHARTS) build(def); chartsEl.dataset.charts = String(charts.size); }

  // --- one stream per compared run ----------------------------------------------------------
  function facts(run, msg) {
    const row = document.querySelector(`tr.compare-run[data-run="${run.id}"]`);
    const cell = row && row.querySelector("td.num");
    if (cell) cell.textContent = `${msg.last_step}/${msg.max_steps}`;
    const badge = row && row.querySelector(".badge");
    if (badge && msg.state) {
      badge.className = `badge state-${msg.state}`;
      badge.textContent = msg.state.charAt(0).toUpperCase() + msg.state.slice(1);
    }
  }

  function follow(run) {
    let cursors = null;
    let seq = 0;
    let backoff = 1000;
    let socket = null;
    function onMessage(msg) {
      if (msg.seq !== seq + 1) { socket.close(4000, "sequence gap"); return; }
      seq = msg.seq;
      if (msg.type === "snapshot") { run.data = new Map(); run.events = []; }
      if (msg.truncate_after !== undefined) {
        for (const m of run.data.values()) for (const s of [...m.keys()]) if (s > msg.truncate_after) m.delete(s);
        run.events = run.events.filter((e) => e.step === null || e.step <= msg.truncate_after || e.kind === "run.started");
      }
      for (const [key, points] of Object.entries(msg.series || {})) {
        let m = run.data.get(key);
        if (!m) { m = new Map(); run.data.set(key, m); }
        for (const [step, value] of points) m.set(step, value);
      }
      run.events = run.events.concat(msg.events || []);
      cursors = msg.cursors;
      facts(run, msg);
      run.live = true;
      redraw();
    }
    function connect() {
      const scheme = location.protocol === "https:" ? "wss" : "ws";
      const resume = cursors !== null;
      seq = 0;
      socket = new WebSocket(`${scheme}://${location.host}/ws/runs/${run.id}/${resume ? "?resume=1" : ""}`);
      socket.onopen = () => { backoff = 1000; if (resume) socket.send(JSON.stringify({ type: "resume", since: cursors })); };
      socket.onmessage = (e) => onMessage(JSON.parse(e.data));
      socket.onclose = (e) => {
        run.live = false;
        if (stopped || [4401, 4403, 4404, 1007].includes(e.code)) return;
        setTimeout(connect, backoff);
        backoff = Math.min(backoff * 2, 30000);
      };
    }
    connect();
    return { close: () => socket && socket.close() };
  }

  let stopped = false;
  window.RunCharts.smoothingControl(document.getElementById("chart-controls"), buildAll);
  window.addEventListener("resize", () => { for (const c of charts.values()) c.plot.setSize({ width: width(), height: 220 }); });
  buildAll();
  const streams = runs.map(follow);
  window.addEventListener("pagehide", () => { stopped = true; for (const s of streams) s.close(); });
  // Tests read what a chart draws through this.
  window.runCompare = {
    charts: () => charts.size,
    plot: (id) => charts.get(id).plot,
    live: () => runs.every((run) => run.live),
    events: () => allEvents().length,
    chart: (id) => { const c = charts.get(id); return c && { series: c.plot.series.length - 1, distr: c.plot.scales.y.distr, data: c.plot.data, x: [c.plot.scales.x.min, c.plot.scales.x.max] }; },
  };
})();
