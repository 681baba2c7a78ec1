// The compare page: several runs' series (embedded by the server as JSON in #compare-data,
// min/max downsampled per run; also GET /api/runs/compare?ids=…) overlaid on one chart per
// metric group, one colour per run, with the run page's smoothing and log-scale controls
// (static/runs-charts.js), a shared cursor and drag-to-zoom.
(function () {
  "use strict";
  const source = document.getElementById("compare-data");
  const chartsEl = document.getElementById("compare-charts");
  if (!source || !chartsEl || typeof uPlot === "undefined" || !window.RunCharts) return;
  const { CHARTS, COLORS } = window.RunCharts;
  const runs = JSON.parse(source.textContent);
  const charts = new Map();

  function width() { return Math.max(280, Math.min(560, (chartsEl.clientWidth || 600) / 2 - 16)); }

  // The lines of one chart: every (run, key) pair whose key the chart draws.
  function linesOf(def) {
    const pairs = [];
    runs.forEach((run, r) => {
      for (const key of Object.keys(run.series).sort()) if (def.match(key)) pairs.push({ run, r, key });
    });
    const steps = new Set();
    for (const p of pairs) for (const [s] of p.run.series[p.key]) steps.add(s);
    const xs = [...steps].sort((a, b) => a - b);
    const ys = pairs.map((p) => {
      const m = new Map(p.run.series[p.key]);
      return xs.map((s) => (m.has(s) ? m.get(s) : null));
    });
    const labels = pairs.map((p) => `${p.run.name} #${p.run.id} · ${p.key}`);
    return { pairs, xs, ys, labels };
  }

  function build(def) {
    const { pairs, xs, ys, labels } = linesOf(def);
    if (!pairs.length) return;
    let entry = charts.get(def.id);
    if (entry) entry.plot.destroy();
    else {
      entry = window.RunCharts.figure(def, CHARTS.indexOf(def), (d) => build(d));
      chartsEl.append(entry.el);
      charts.set(def.id, entry);
    }
    entry.plotEl.textContent = "";
    const { series, data } = window.RunCharts.lines(labels, ys, def.id, (i) => COLORS[pairs[i].r % COLORS.length]);
    const opts = window.RunCharts.options(def, width(), series, {
      cursor: { sync: { key: "run-compare" } },
      plugins: [window.RunCharts.zoomSync(() => [...charts.values()].map((c) => c.plot).filter(Boolean))],
    });
    entry.plot = new uPlot(opts, [xs, ...data], entry.plotEl);
    entry.el.dataset.runs = String(new Set(pairs.map((p) => p.run.id)).size);
    entry.el.dataset.points = String(ys.reduce((n, y) => n + y.filter((v) => v !== null).length, 0));
  }

  function buildAll() { for (const def of CHARTS) build(def); chartsEl.dataset.charts = String(charts.size); }

  window.RunCharts.smoothingControl(document.getElementById("chart-controls"), buildAll);
  window.addEventListener("resize", () => { for (const c of charts.values()) c.plot.setSize({ width: width(), height: 220 }); });
  buildAll();
  // Tests read what a chart draws through this.
  window.runCompare = {
    charts: () => charts.size,
    plot: (id) => charts.get(id).plot,
    chart: (id) => { const c = charts.get(id); return c && { series: c.plot.series.length - 1, distr: c.plot.scales.y.distr, data: c.plot.data, x: [c.plot.scales.x.min, c.plot.scales.x.max] }; },
  };
})();
