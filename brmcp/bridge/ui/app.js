// brmcp bridge approvals page: live updates and one-click decisions.
// Progressive enhancement: without this script the page's forms still work.
(function () {
  "use strict";
  var csrf = document.querySelector('meta[name="brmcp-csrf"]').content;
  var status = document.getElementById("status");
  var version = Number(document.body.dataset.version || 0);
  var ids = ["approvals", "spend", "balances", "settings"];

  function apply(data) {
    ids.forEach(function (id) {
      var el = document.getElementById(id);
      if (el && typeof data[id] === "string") { el.innerHTML = data[id]; }
    });
    var count = document.getElementById("pending-count");
    if (count) { count.textContent = String(data.pending_count); }
    version = data.version;
    document.body.dataset.version = String(version);
    document.title = (data.pending_count ? "(" + data.pending_count + ") " : "") + "brmcp bridge: approvals";
  }

  function fetchState(wait) {
    var url = "/ui/state" + (wait ? "?after=" + encodeURIComponent(version) : "");
    return fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) {
        if (r.status === 401) { location.reload(); throw new Error("logged out"); }
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(apply);
  }

  function poll() {
    fetchState(true).then(function () {
      status.textContent = "live";
      poll();
    }, function () {
      status.textContent = "reconnecting…";
      setTimeout(poll, 2000);
    });
  }

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!form.classList || !form.classList.contains("decide")) { return; }
    ev.preventDefault();
    form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    var notice = document.getElementById("notice");
    fetch(form.action, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Accept": "application/json", "X-CSRF-Token": csrf }
    }).then(function (r) {
      // 409: the payment was withdrawn (its agent went away); say so.
      if (r.ok || !notice) { return; }
      return r.json().then(function (d) { notice.textContent = d.error || ("HTTP " + r.status); });
    }).then(function () { return fetchState(false); }, function () { return fetchState(false); });
  });

  status.textContent = "live";
  poll();
})();
