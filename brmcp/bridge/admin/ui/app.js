// brmcp bridge approvals page: live updates, countdowns and one-click decisions.
// Progressive enhancement: without this script the page's forms still work.
// Text that comes from agents, bots, directories or brclient (call
// arguments, search hits, decision messages, errors) is only ever set with
// textContent, never as markup. The "Find tools" view builds its elements
// with createElement; a directory's answer is shown, never acted on: a bot
// is added only when the user confirms the Add.
(function () {
  "use strict";
  var csrf = document.querySelector('meta[name="brmcp-csrf"]').content;
  var status = document.getElementById("status");
  var version = Number(document.body.dataset.version || 0);
  var ids = ["approvals", "bot-requests", "decisions", "spend", "balances", "settings"];
  var capsEl = document.getElementById("find-caps");
  var caps = capsEl ? {
    perCallCapAtoms: Number(capsEl.dataset.perCall),
    perDayCapAtoms: Number(capsEl.dataset.perDay),
    mode: capsEl.dataset.mode
  } : null;
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
    if (data.caps && typeof data.caps === "object") { caps = data.caps; }
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

  // -- Find tools ---------------------------------------------------------------

  var MAX_TEXT = 300;
  var UID = /^[0-9a-f]{64}$/;

  function cut(value, limit) {
    // Printable text of at most limit characters (a directory is a stranger).
    var text = String(value === undefined || value === null ? "" : value).replace(/[\u0000-\u001f\u007f-\u009f\u2028-\u202e\u2066-\u2069]/g, "");
    return text.length <= limit ? text : text.slice(0, limit - 1) + "…";
  }

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) { node.className = className; }
    if (text !== undefined) { node.textContent = text; }
    return node;
  }

  function api(method, path, body) {
    var init = {
      method: method,
      credentials: "same-origin",
      headers: { "Accept": "application/json", "X-CSRF-Token": csrf }
    };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch("/ui/api/" + path, init).then(function (r) {
      return r.json().then(function (d) { return { status: r.status, data: d || {} }; },
        function () { return { status: r.status, data: {} }; });
    }).then(function (answer) {
      if (answer.status !== 200) {
        throw new Error(cut(answer.data.error || ("HTTP " + answer.status), 600));
      }
      return answer.data;
    });
  }

  function age(now, ts) {
    // The same text as brmcp-bridge find (format_age).
    if (typeof ts !== "number" || ts <= 0) { return "never"; }
    var delta = Math.floor(now - ts);
    if (delta < 0) { return "in the future"; }
    var units = [["d", 86400], ["h", 3600], ["m", 60]];
    for (var i = 0; i < units.length; i++) {
      if (delta >= units[i][1]) { return Math.floor(delta / units[i][1]) + units[i][0] + " ago"; }
    }
    return delta + "s ago";
  }

  function price(claim) {
    if (claim.pricing === "dynamic") { return "dynamic price"; }
    if (typeof claim.priceAtoms === "number") {
      return claim.priceAtoms === 0 ? "free" : claim.priceAtoms.toLocaleString("en-US") + " atoms";
    }
    return "price not given";
  }

  function renderHits(result) {
    var box = document.getElementById("find-results");
    box.textContent = "";
    var now = typeof result.now === "number" ? result.now : 0;
    var hits = Array.isArray(result.hits) ? result.hits : [];
    if (!hits.length) { box.appendChild(el("p", "empty", "No tools found.")); }
    hits.forEach(function (hit) {
      if (!hit || typeof hit.providerUid !== "string") { return; }
      var uid = hit.providerUid.toLowerCase();
      var claims = Array.isArray(hit.claims) ? hit.claims : [];
      var first = claims[0] || {};
      var row = el("div", "hit");
      row.dataset.provider = cut(uid, 64);
      var head = el("p");
      head.appendChild(el("span", "tool", cut(hit.tool, MAX_TEXT)));
      head.appendChild(document.createTextNode(" — " + price(first)));
      var tags = Array.isArray(first.tags) ? first.tags.slice(0, 16).map(function (t) { return cut(t, 64); }) : [];
      if (tags.length) { head.appendChild(el("span", "tags", " [" + tags.join(", ") + "]")); }
      row.appendChild(head);
      var who = el("p", "small");
      who.appendChild(document.createTextNode("provider "));
      who.appendChild(el("span", "uid", cut(uid, 64)));
      row.appendChild(who);
      if (first.description) { row.appendChild(el("p", "description", cut(first.description, MAX_TEXT))); }
      var said = el("ul", "claims");
      claims.slice(0, 16).forEach(function (claim) {
        var verified = claim.lastVerifiedExecution ? "verified by a paid call " + age(now, claim.lastVerifiedExecution)
          : "never verified by a paid call";
        said.appendChild(el("li", "claim", "claimed by directory " + cut(claim.directory, 64) + ": " + price(claim) +
          ", " + verified + ", catalog checked " + age(now, claim.catalogCheckedAt)));
      });
      row.appendChild(said);
      if (UID.test(uid)) {
        var add = el("button", "add", "Add");
        add.type = "button";
        add.dataset.uid = uid;
        row.appendChild(add);
      }
      box.appendChild(row);
    });
    var failed = (Array.isArray(result.directories) ? result.directories : []).filter(function (d) {
      return d && d.outcome !== "ok";
    });
    if (failed.length) {
      var list = el("ul", "find-failed");
      failed.forEach(function (d) {
        list.appendChild(el("li", "", "directory " + cut(d.directory, 64) + " " + cut(d.outcome, 32) + ": " +
          cut(d.error || d.outcome, 600)));
      });
      box.appendChild(el("p", "", "Directories that did not answer:"));
      box.appendChild(list);
    }
    if (hits.length) {
      box.appendChild(el("p", "small", "Prices, tags, descriptions and verification times are the directories' " +
        "claims; the bot's own price binds, within your caps. Nothing is added until you confirm an Add."));
    }
  }

  var findForm = document.getElementById("find-form");
  document.querySelectorAll(".noscript-note").forEach(function (n) { n.hidden = true; });
  if (findForm) {
    findForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var box = document.getElementById("find-results");
      var tag = document.getElementById("find-tag").value.trim();
      var max = document.getElementById("find-max-price").value.trim();
      var body = {
        query: document.getElementById("find-query").value,
        tags: tag ? [tag] : [],
        maxPriceAtoms: max ? Number(max) : 0
      };
      if (!Number.isSafeInteger(body.maxPriceAtoms) || body.maxPriceAtoms < 0) {
        box.textContent = "Max price: a whole number of atoms, 0 or more (empty: no limit).";
        return;
      }
      var go = document.getElementById("find-go");
      go.disabled = true;
      box.textContent = "Asking the directories…";
      api("POST", "find", body).then(renderHits, function (err) {
        box.textContent = "The search failed: " + err.message;
      }).then(function () { go.disabled = false; });
    });
  }

  // -- Add: only on the user's confirmation ---------------------------------------

  var confirmBox = document.getElementById("add-confirm");
  var adding = null;

  function capsText() {
    if (!caps) { return "The bridge's caps apply."; }
    var fmt = function (n) { return n > 0 ? Number(n).toLocaleString("en-US") + " atoms" : "0 (never pay)"; };
    return "Caps that will apply: per call " + fmt(caps.perCallCapAtoms) + ", per day " + fmt(caps.perDayCapAtoms) +
      " (mode " + cut(caps.mode, 16) + ").";
  }

  function openConfirm(uid) {
    adding = uid;
    document.getElementById("add-uid").textContent = uid;
    document.getElementById("add-caps").textContent = capsText();
    document.getElementById("add-per-call").value = "";
    document.getElementById("add-per-day").value = "";
    document.getElementById("add-progress").textContent = "";
    document.getElementById("add-yes").disabled = false;
    confirmBox.hidden = false;
    confirmBox.scrollIntoView({ block: "nearest" });
  }

  function capField(id, key, body) {
    var value = document.getElementById(id).value.trim();
    if (!value) { return true; }
    var n = Number(value);
    if (!Number.isSafeInteger(n) || n < 0) {
      document.getElementById("add-progress").textContent = key + ": a whole number of atoms, 0 or more (empty keeps it).";
      return false;
    }
    body[key] = n;
    return true;
  }

  function progress(text) { document.getElementById("add-progress").textContent = text; }

  function confirmAdd() {
    var uid = adding;
    if (!uid || !UID.test(uid)) { return; }
    var body = { uid: uid };
    if (!capField("add-per-call", "perCallCapAtoms", body) || !capField("add-per-day", "perDayCapAtoms", body)) {
      return;
    }
    document.getElementById("add-yes").disabled = true;
    progress("Checking whether " + uid + " is a contact of your brclient…");
    api("GET", "contact/" + uid).then(function (c) {
      if (c.contact !== false) { return null; }
      progress("Asking a directory to introduce you to " + uid + "…");
      return api("POST", "introduce", { uid: uid }).then(function (intro) {
        var via = cut(intro.via, 64);
        progress("Directory " + via + " sent your brclient a KX suggestion" +
          (intro.note ? " (" + cut(intro.note, MAX_TEXT) + ")" : "") +
          ". Accept it: in brclient type the /mi command it shows (/mi <the directory's nick> " + uid +
          "), or: /mi " + via + " " + uid + ". Waiting up to 300 s for the key exchange…");
        return api("POST", "wait-kx", { uid: uid, timeout_secs: 300 });
      });
    }).then(function () {
      return api("POST", "add-bot", body);
    }).then(function (done) {
      progress(done.message || "Added.");
      say(done.message || "Added.", "ok");
      adding = null;
    }, function (err) {
      progress("Not added: " + err.message);
      document.getElementById("add-yes").disabled = false;
    }).then(function () { return fetchState(false); }).catch(function () {});
  }

  document.addEventListener("click", function (ev) {
    var target = ev.target;
    if (!target || !target.classList) { return; }
    if (target.classList.contains("add") && target.dataset.uid && confirmBox) {
      openConfirm(target.dataset.uid);
    } else if (target.id === "add-yes") {
      confirmAdd();
    } else if (target.id === "add-cancel") {
      adding = null;
      confirmBox.hidden = true;
    }
  });

  setInterval(tick, 1000);
  tick();
  status.textContent = "live";
  poll();
})();
