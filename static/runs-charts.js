// What the run page (runs-live.js) and the compare page (runs-compare.js) share: the charts and
// the metric keys each draws (names from training/metrics.py), smoothing (an exponential moving
// average, debiased at the start as TensorBoard's slider does; the raw series stays drawn,
// faint) and a log scale per chart. Settings are kept in localStorage per browser.
(function () {
  "use strict";
  const one = (name) => (k) => k === name;
  const CHARTS = [
    // rewards: critic/score/mean is written too, as an alias of reward/mean
    { id: "reward", title: "Reward mean (reward/mean = critic/score/mean; per domain)", match: (k) => /^reward\/mean$|^reward\/[^/]+\/mean$/.test(k) },
    { id: "std", title: "Reward std (per domain)", match: (k) => /^reward\/std$|^reward\/[^/]+\/std$/.test(k) },
    { id: "criterion", title: "Criterion score mean (reward/<domain>/<criterion>/mean)", match: (k) => /^reward\/[^/]+\/[^/]+\/mean$/.test(k) },
    { id: "criterion-std", title: "Criterion score std", match: (k) => /^reward\/[^/]+\/[^/]+\/std$/.test(k) },
    { id: "pass", title: "Pass rate (train; per domain)", match: (k) => /^pass_rate(\/[^/]+)?$/.test(k) },
    { id: "eval", title: "Held-out reward mean (eval/reward; per domain)", match: (k) => /^eval\/reward\/mean$|^eval\/reward\/[^/]+\/mean$/.test(k) },
    { id: "eval-pass", title: "Held-out pass rate (eval/pass_rate)", match: (k) => /^eval\/pass_rate(\/[^/]+)?$/.test(k) },
    // the policy update
    { id: "kl", title: "KL (actor/kl)", match: one("actor/kl") },
    { id: "entropy", title: "Entropy (actor/entropy)", match: one("actor/entropy") },
    { id: "grad", title: "Grad norm (actor/grad_norm)", match: one("actor/grad_norm") },
    { id: "clip", title: "Clip fraction (actor/pg_clipfrac)", match: one("actor/pg_clipfrac") },
    // rollouts
    { id: "length", title: "Response length (response_length/mean)", match: one("response_length/mean") },
    { id: "length-clip", title: "Response clip ratio (response_length/clip_ratio)", match: one("response_length/clip_ratio") },
    { id: "zero", title: "Zero-variance groups and discarded samples (fraction)", match: (k) => k === "frac_reward_zero_std" || k === "batch/discarded_fraction" },
    // the system
    { id: "throughput", title: "Throughput (perf/throughput, tokens/s)", match: one("perf/throughput") },
    { id: "timing", title: "Stage timings (timing_s/…, s)", match: (k) => /^timing_s\//.test(k) },
  ];
  const COLORS = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#4b5563"];
  const STORE = "runCharts.v1";

  function load() {
    try { return JSON.parse(localStorage.getItem(STORE)) || {}; } catch (e) { return {}; }
  }
  const settings = Object.assign({ smoothing: 0, log: {} }, load());
  function save() { try { localStorage.setItem(STORE, JSON.stringify(settings)); } catch (e) { /* private mode */ } }

  // TensorBoard's smoothing: an EMA whose start is debiased; gaps (null) stay gaps.
  function ema(values, weight) {
    if (!(weight > 0)) return values.slice();
    let last = 0;
    let n = 0;
    return values.map((v) => {
      if (v === null || v === undefined || !Number.isFinite(v)) return null;
      last = last * weight + (1 - weight) * v;
      n += 1;
      return last / (1 - Math.pow(weight, n));
    });
  }

  function faint(color) { return color + "4d"; } // 30 % opacity

  // ys: one array per labelled line; returns uPlot's series (after x) and the data arrays.
  function lines(labels, ys, chartId, colorOf) {
    const smoothing = settings.smoothing;
    const log = !!settings.log[chartId];
    const series = [];
    const data = [];
    labels.forEach((label, i) => {
      const color = colorOf ? colorOf(i) : COLORS[i % COLORS.length];
      let raw = ys[i];
      if (log) raw = raw.map((v) => (v !== null && v > 0 ? v : null));
      if (smoothing > 0) {
        series.push({ label: `${label} (raw)`, stroke: faint(color), width: 1, spanGaps: true, show: true });
        data.push(raw);
        series.push({ label, stroke: color, width: 1.75, spanGaps: true });
        data.push(ema(raw, smoothing));
      } else {
        series.push({ label, stroke: color, width: 1.5, spanGaps: true });
        data.push(raw);
      }
    });
    return { series, data };
  }

  function options(def, width, series, extra) {
    const log = !!settings.log[def.id];
    return Object.assign({
      title: def.title,
      width,
      height: 220,
      scales: { x: { time: false }, y: log ? { distr: 3 } : {} },
      axes: [{ label: "step" }, {}],
      series: [{ label: "step" }, ...series],
    }, extra || {});
  }

  // The figure of one chart: a toolbar with its log toggle, and the plot.
  function figure(def, order, onLog) {
    const el = document.createElement("figure");
    el.className = "live-chart";
    el.id = `chart-${def.id}`;
    el.dataset.order = String(order);
    const bar = document.createElement("div");
    bar.className = "chart-tools";
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.className = "log-toggle";
    box.checked = !!settings.log[def.id];
    box.addEventListener("change", () => {
      if (box.checked) settings.log[def.id] = true; else delete settings.log[def.id];
      save();
      onLog(def);
    });
    label.append(box, " log scale");
    bar.append(label);
    const plot = document.createElement("div");
    plot.className = "chart-plot";
    el.append(bar, plot);
    return { el, plotEl: plot };
  }

  // The smoothing slider (0 … 0.99) in `container`; `onChange` redraws.
  function smoothingControl(container, onChange) {
    if (!container) return;
    const label = document.createElement("label");
    label.className = "smoothing";
    const slider = document.createElement("input");
    slider.type = "range";
    slider.min = "0";
    slider.max = "0.99";
    slider.step = "0.01";
    slider.id = "smoothing";
    slider.value = String(settings.smoothing);
    const shown = document.createElement("output");
    shown.id = "smoothing-value";
    shown.textContent = Number(settings.smoothing).toFixed(2);
    slider.addEventListener("input", () => {
      settings.smoothing = Number(slider.value);
      shown.textContent = settings.smoothing.toFixed(2);
      save();
      onChange();
    });
    label.append("Smoothing ", slider, " ", shown);
    container.append(label);
  }

  // Zoom shared by a page's charts: a range dragged on one is set on the others, and a
  // double-click resets them all. A user's zoom is an x range narrower than the chart's own
  // points (uPlot's own rescaling after new points always spans them all, and a synced drag
  // can reach a chart with the selection already cleared, so the range is what tells). The
  // page's zoom is kept in `zoom.range` (null: the whole run), so new points or a rebuilt
  // chart keep it (`setData`, `keepZoom`). `plots` lists the page's uPlot instances.
  const zoom = { range: null };
  let applying = false;
  function keepZoom(plot) {
    if (!zoom.range || !plot.scales.x) return;
    applying = true;
    try { plot.setScale("x", { min: zoom.range.min, max: zoom.range.max }); } finally { applying = false; }
  }
  // New points into a chart: with a zoom, the scales are not reset to the whole run first.
  function setData(plot, data) {
    if (!zoom.range) { plot.setData(data); return; }
    plot.setData(data, false);
    keepZoom(plot);
  }
  function zoomSync(plots) {
    let busy = false;
    function each(u, fn) {
      if (busy) return;
      busy = true;
      try { for (const other of plots()) if (other !== u && other.scales.x) fn(other); } finally { busy = false; }
    }
    return {
      hooks: {
        setScale: (u, key) => {
          if (key !== "x" || applying || busy) return;
          const xs = u.data[0];
          if (!xs || !xs.length) return;
          const { min, max } = u.scales.x;
          if (min <= xs[0] && max >= xs[xs.length - 1]) return; // the whole chart: no zoom
          zoom.range = { min, max };
          each(u, (other) => other.setScale("x", { min, max }));
        },
        ready: (u) => {
          u.over.addEventListener("dblclick", () => {
            zoom.range = null;
            each(u, (other) => {
              const xs = other.data[0];
              if (xs.length) other.setScale("x", { min: xs[0], max: xs[xs.length - 1] });
            });
          });
        },
      },
    };
  }

  // Event markers (started, resumed, preempted, overrides, checkpoints, attempts on a host):
  // a dashed line at each event's step, in the event's `color` when it has one (the compare
  // page colours by run), with the events near the cursor in a tooltip (`label`, the step,
  // the kind, the reason). `events()` returns the page's current list.
  const tip = document.createElement("div");
  tip.className = "marker-tip";
  tip.hidden = true;
  if (document.body) document.body.appendChild(tip);
  else document.addEventListener("DOMContentLoaded", () => document.body.appendChild(tip));
  function markers(events) {
    return {
      hooks: {
        draw: (u) => {
          const ctx = u.ctx;
          ctx.save();
          ctx.setLineDash([4, 4]);
          ctx.lineWidth = 1;
          for (const e of events()) {
            if (e.step === null || e.step === undefined) continue;
            const x = Math.round(u.valToPos(e.step, "x", true));
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
            ctx.strokeStyle = e.color ? e.color + "b3" : "rgba(120,120,120,.7)";
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
          }
          ctx.restore();
        },
        setCursor: (u) => {
          const left = u.cursor.left;
          if (left == null || left < 0) { tip.hidden = true; return; }
          const near = events().filter((e) => e.step !== null && e.step !== undefined && Math.abs(u.valToPos(e.step, "x") - left) <= 4);
          if (!near.length) { tip.hidden = true; return; }
          tip.textContent = near.map((e) => `${e.label ? e.label + ": " : ""}step ${e.step}: ${e.kind}${e.reason ? " — " + e.reason : ""}`).join("\n");
          const box = u.over.getBoundingClientRect();
          tip.style.left = `${window.scrollX + box.left + left + 8}px`;
          tip.style.top = `${window.scrollY + box.top + 4}px`;
          tip.hidden = false;
        },
      },
    };
  }

  window.RunCharts = { CHARTS, COLORS, ema, lines, options, figure, smoothingControl, zoomSync, zoom, keepZoom, setData, markers, settings };
})();
