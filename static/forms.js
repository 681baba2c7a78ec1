// Inline checks: a result describes the text it was computed for. As soon as that text changes,
// the shown result is replaced by "Checking…" until the new one arrives; a check that fails to
// come back (server error, dropped connection) says so instead of leaving the old verdict.
(function () {
  // The status beside the field that changed, or (for a check the whole form sent) the form's.
  function statusFor(element) {
    if (!element.closest) return null;
    const scope = element.closest(".field") || element.closest("form");
    return scope ? scope.querySelector("[data-check-status]") : null;
  }
  function show(status, text, className) {
    status.replaceChildren();
    const line = document.createElement("p");
    line.className = className;
    line.textContent = text;
    status.appendChild(line);
  }
  document.addEventListener("input", function (event) {
    const field = event.target.closest && event.target.closest(".field");
    const status = field ? field.querySelector("[data-check-status]") : null;
    if (status) show(status, "Checking…", "muted checking");
  });
  function failed(event) {
    const status = statusFor(event.target);
    if (status) show(status, "Could not check the spec just now; saving will check it.", "error");
  }
  document.addEventListener("htmx:responseError", failed);
  document.addEventListener("htmx:sendError", failed);
})();
