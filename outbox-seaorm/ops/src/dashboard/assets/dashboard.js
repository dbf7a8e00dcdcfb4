// Refreshes the overview every few seconds without reloading the page (no framework, no build step).
(function () {
  "use strict";
  var body = document.body;
  if (!document.getElementById("overview")) return;
  var every = Number(body.getAttribute("data-refresh-ms")) || 5000;
  // The same chart span as the page (`?span=1h`).
  var url = body.getAttribute("data-base") + "/fragments/overview" + window.location.search;
  function refresh() {
    fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (text === null) return;
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("overview");
        var current = document.getElementById("overview");
        if (fresh && current) current.replaceWith(fresh);
      })
      .catch(function () { /* the next tick tries again */ });
  }
  // A first view shows a placeholder while the server reads the backlog: ask for the figures now.
  if (document.getElementById("overview").hasAttribute("data-reading")) refresh();
  setInterval(refresh, every);
})();
