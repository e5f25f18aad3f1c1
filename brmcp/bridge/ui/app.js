// brmcp bridge approvals page: live updates, countdowns and one-click decisions.
// Progressive enhancement: without this script the page's forms still work.
// Text that comes from agents, bots or brclient (call arguments, decision
// messages, errors) is only ever set with textContent, never as markup.
(function () {
  "use strict";
  var csrf = document.querySelector('meta[name="brmcp-csrf"]').content;
  var status = document.getElementById("status");
  var version = Number(document.body.dataset.version || 0);
  var ids = ["approvals", "decisions", "spend", "balances", "settings"];
  // When the countdowns' data-remaining values were rendered (this page's clock).
  var synced = performance.now();

  function timeLeft(seconds) {
    // The same text as pages.time_left.
    if (seconds <= 0) { return "time is up"; }
    var whole = Math.floor(seconds);
    var minutes = Math.floor(whole / 60);
    var secs = whole % 60;
    if (!minutes) { return secs + "s left"; }
    return minutes + "m " + (secs < 10 ? "0" : "") + secs + "s left";
  }

  function tick() {
    var elapsed = (performance.now() - synced) / 1000;
    document.querySelectorAll("#approvals .countdown").forEach(function (el) {
      var left = Number(el.dataset.remaining) - elapsed;
      el.textContent = timeLeft(left);
      el.classList.toggle("urgent", left < 30);
    });
  }

  function fillArguments(pending) {
    (pending || []).forEach(function (p) {
      if (typeof p.arguments !== "string") { return; }
      document.querySelectorAll("#approvals pre.args").forEach(function (el) {
        if (el.dataset.argsFor === p.id) { el.textContent = p.arguments; }
      });
    });
  }

  function apply(data) {
    ids.forEach(function (id) {
      var el = document.getElementById(id);
      // Server-rendered HTML in which everything from outside is escaped;
      // the call arguments are not in it (fillArguments sets them as text).
      if (el && typeof data[id] === "string") { el.innerHTML = data[id]; }
    });
    fillArguments(data.pending);
    synced = performance.now();
    tick();
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

  function say(text, kind) {
    var notice = document.getElementById("notice");
    if (!notice) { return; }
    notice.className = "notice " + kind;
    notice.textContent = text;
  }

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!form.classList || !form.classList.contains("decide")) { return; }
    ev.preventDefault();
    var buttons = form.parentNode ? form.parentNode.querySelectorAll("button") : form.querySelectorAll("button");
    buttons.forEach(function (b) { b.disabled = true; });
    fetch(form.action, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Accept": "application/json", "X-CSRF-Token": csrf }
    }).then(function (r) {
      return r.json().then(function (d) { return { status: r.status, data: d || {} }; },
        function () { return { status: r.status, data: {} }; });
    }).then(function (answer) {
      if (answer.status === 200) {
        say(answer.data.message || "Decided.", "ok");
      } else if (answer.status === 409) {
        // Too late: timed out, withdrawn (the agent went away) or decided already.
        say(answer.data.error || "HTTP 409", "late");
      } else {
        say(answer.data.error || ("HTTP " + answer.status), "error");
      }
    }, function (err) {
      say("the decision could not be sent: " + err.message, "error");
      buttons.forEach(function (b) { b.disabled = false; });
    }).then(function () { return fetchState(false); }).catch(function () {});
  });

  setInterval(tick, 1000);
  tick();
  status.textContent = "live";
  poll();
})();
