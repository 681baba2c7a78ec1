// The scheduler's pages, live (console/scheduling/consumers.py): the element with data-ws
// (#queue, #hosts or #inbox) opens that socket; each {type: "changed"} it sends makes the
// element re-read itself through its view (htmx, hx-trigger="live-changed"), so the server
// renders what this user may see. While a text box inside it has the focus (a rejection
// reason being typed) the re-read waits until the focus leaves, and one already in flight is
// not swapped in, so nothing typed is lost.
// A socket that reconnects re-reads once (it may have missed rings meanwhile).
(function () {
  "use strict";
  let backoff = 1000;
  let stopped = false;
  let owed = false;
  let wasOpen = false;

  function part() { return document.querySelector("[data-ws]"); }
  function say(text) {
    const el = document.getElementById("live-status");
    if (el) el.textContent = text;
  }

  function refresh() {
    const el = part();
    if (!el) return;
    if (el.querySelector("input:focus, select:focus, textarea:focus")) { owed = true; return; }
    owed = false;
    htmx.trigger(el, "live-changed");
  }

  function connect() {
    const el = part();
    if (!el) return;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}${el.dataset.ws}`);
    socket.onopen = () => {
      backoff = 1000;
      window.schedulingLiveOpen = true;
      say("live");
      if (wasOpen) refresh();
      wasOpen = true;
    };
    socket.onmessage = (e) => {
      const msg = JSON.parse(e.data);
      if (msg.type === "changed") { window.schedulingLiveSeq = msg.seq; refresh(); }
    };
    socket.onclose = (e) => {
      window.schedulingLiveOpen = false;
      if (stopped) return;
      if ([4401, 4403, 4404, 1007].includes(e.code)) { say("not live: reload the page"); return; }
      say(`reconnecting in ${Math.round(backoff / 1000)} s…`);
      setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 30000);
    };
  }

  // Heartbeat ages (fleet) count up between re-reads: agents beat every few seconds, too
  // often to ring every open page for.
  function stampAges() {
    const now = performance.now();
    for (const el of document.querySelectorAll("[data-age]")) el.dataset.since = String(now);
  }
  setInterval(() => {
    const now = performance.now();
    for (const el of document.querySelectorAll("[data-age][data-since]")) {
      const age = Number(el.dataset.age) + (now - Number(el.dataset.since)) / 1000;
      el.textContent = `${Math.round(age)} s ago`;
    }
  }, 1000);

  document.addEventListener("focusout", () => { if (owed) setTimeout(refresh, 0); });
  // A re-read already on its way when the focus went into a text box (the admin pressed r
  // while the answer was in flight) is dropped, not swapped over what is being typed; the
  // next one is owed to the moment the focus leaves.
  document.body.addEventListener("htmx:beforeSwap", (event) => {
    const el = part();
    if (!el || event.detail.target !== el) return;
    if (el.querySelector("input:focus, select:focus, textarea:focus")) {
      event.detail.shouldSwap = false;
      owed = true;
    }
  });
  document.body.addEventListener("htmx:afterSwap", stampAges);
  window.addEventListener("pagehide", () => { stopped = true; });
  stampAges();
  connect();
})();
