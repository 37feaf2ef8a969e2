// monarch dashboard: keeps #live up to date from the server's event stream
// (server-sent events: the server pushes a new rendering when the data changed,
// the page never polls).  No framework, no build step.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var page = live.dataset.page;
  var conn = document.getElementById("conn");
  var source = null;
  var ended = conn.dataset.ended === "1";
  var failedTries = 0;
  // <details> the user opened or closed (by id): kept across live updates
  var toggled = {};

  function query() {
    var params = new URLSearchParams();
    params.set("page", page);
    var form = document.getElementById("filters");
    if (form) {
      new FormData(form).forEach(function (v, k) { if (v) params.set(k, v); });
    }
    return params;
  }

  function openRanks() {
    return Array.prototype.map.call(live.querySelectorAll("tr.ranks:not([hidden])"), function (e) { return e.id; });
  }

  function apply(html) {
    var logs = document.getElementById("log-lines");
    var atEnd = logs ? logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4 : false;
    var open = openRanks();
    live.innerHTML = html;
    open.forEach(function (id) { var e = document.getElementById(id); if (e) e.hidden = false; });
    Object.keys(toggled).forEach(function (id) {
      var d = document.getElementById(id);
      if (d && d.tagName === "DETAILS") d.open = toggled[id];
    });
    var follow = document.getElementById("follow");
    logs = document.getElementById("log-lines");
    if (logs && (atEnd || (follow && follow.checked))) logs.scrollTop = logs.scrollHeight;
  }

  function showEnded(when) {
    ended = true;
    if (source) source.close();
    source = null;
    conn.textContent = "job ended at " + when;
    conn.className = "conn ended";
  }

  function connect() {
    if (ended) return;
    if (source) source.close();
    source = new EventSource("/events?" + query().toString());
    source.addEventListener("update", function (ev) {
      var msg = JSON.parse(ev.data);
      apply(msg.html);
      var badge = document.getElementById("failure-count");
      if (msg.failures && !badge) {
        var nav = document.getElementById("nav-failures");
        badge = document.createElement("span");
        badge.id = "failure-count";
        badge.className = "badge bad";
        nav.appendChild(document.createTextNode(" "));
        nav.appendChild(badge);
      }
      if (badge) badge.textContent = msg.failures;
      var meshSelect = document.getElementById("f-mesh");
      if (meshSelect && msg.meshes) {
        var have = Array.prototype.map.call(meshSelect.options, function (o) { return o.value; });
        msg.meshes.forEach(function (m) {
          if (have.indexOf(m) < 0) meshSelect.appendChild(new Option(m, m));
        });
      }
      document.body.dataset.version = msg.version;
      if (msg.ended) showEnded(msg.ended);
    });
    // the server's last message: the job ended (the last state stays on the page)
    source.addEventListener("ended", function (ev) { showEnded(JSON.parse(ev.data).ended); });
    source.onopen = function () { failedTries = 0; conn.textContent = "live"; conn.className = "conn live"; };
    source.onerror = function () {
      if (ended) return;
      failedTries += 1;
      // the browser retries by itself; after a few failed tries the client is gone without a goodbye
      conn.textContent = failedTries > 5 ? "connection lost (the job's client is not answering)" : "reconnecting";
      conn.className = "conn lost";
    };
  }

  live.addEventListener("click", function (ev) {
    var summary = ev.target.closest("summary");
    if (summary) {  // the user opens or closes a <details>: remembered across updates
      var d = summary.parentElement;
      if (d.id) toggled[d.id] = !d.open;
      return;
    }
    if (ev.target.closest("details")) return;  // (inside an opened traceback)
    var row = ev.target.closest("tr.row");
    if (!row) return;
    var ranks = document.getElementById(row.dataset.toggle);
    if (ranks) ranks.hidden = !ranks.hidden;
  });
  var form = document.getElementById("filters");
  if (form) {
    var refilter = function () { history.replaceState(null, "", "?" + query().toString()); connect(); };
    form.addEventListener("change", refilter);
    var typing = null;
    form.addEventListener("input", function (ev) {
      if (ev.target.type !== "search") return;
      clearTimeout(typing);
      typing = setTimeout(refilter, 250);  // search as you type, not on every key
    });
    form.addEventListener("submit", function (ev) { ev.preventDefault(); });
  }
  var rec = document.getElementById("record-form");
  if (rec) {
    rec.addEventListener("submit", function (ev) {
      ev.preventDefault();
      fetch(rec.action, { method: "POST", body: new URLSearchParams(new FormData(rec)), redirect: "manual" });
    });
  }
  connect();
})();
