// monarch dashboard: keeps #live up to date from the server's event stream
// (server-sent events: the server pushes a new rendering when the data changed,
// the page never polls).  No framework, no build step.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var page = live.dataset.page;
  var conn = document.getElementById("conn");
  var source = null;

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
    var follow = document.getElementById("follow");
    logs = document.getElementById("log-lines");
    if (logs && (atEnd || (follow && follow.checked))) logs.scrollTop = logs.scrollHeight;
  }

  function connect() {
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
    });
    source.onopen = function () { conn.textContent = "live"; conn.className = "conn live"; };
    source.onerror = function () { conn.textContent = "reconnecting"; conn.className = "conn lost"; };
  }

  live.addEventListener("click", function (ev) {
    var row = ev.target.closest("tr.row");
    if (!row) return;
    var ranks = document.getElementById(row.dataset.toggle);
    if (ranks) ranks.hidden = !ranks.hidden;
  });
  var form = document.getElementById("filters");
  if (form) {
    form.addEventListener("change", function () { history.replaceState(null, "", "?" + query().toString()); connect(); });
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
