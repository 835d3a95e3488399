// driftless's page script: keeps the page live, adds nothing it needs.
// Served by driftless itself (/assets/page.js); no build step, no library.
// - Rows: one EventSource on the board's `data-events` URL; each `row`
//   event replaces the target's row and moves it to its group, `gone`
//   removes it. On a target's page, a run that starts is followed.
// - Output: a <pre data-follow> gets each `output` event appended until
//   `end`, which says the result (EventSource resumes by itself with
//   Last-Event-ID if the connection drops).
// - Times: every <time data-ms> says how long ago, counting on.
"use strict";

(function () {
  function ago(ms) {
    var s = Math.max(0, Math.floor((Date.now() - ms) / 1000));
    if (s < 60) return s + " s ago";
    if (s < 3600) return Math.floor(s / 60) + " min ago";
    if (s < 86400) return Math.floor(s / 3600) + " h ago";
    return Math.floor(s / 86400) + " d ago";
  }

  function times() {
    var all = document.querySelectorAll("time[data-ms]");
    for (var i = 0; i < all.length; i++) {
      all[i].textContent = ago(Number(all[i].getAttribute("data-ms")));
    }
  }

  function counts() {
    var sections = document.querySelectorAll("section[id^='sec-']");
    for (var i = 0; i < sections.length; i++) {
      var body = sections[i].querySelector("tbody");
      var n = body ? body.children.length : 0;
      sections[i].hidden = n === 0;
      var count = sections[i].querySelector(".count");
      if (count) count.textContent = String(n);
    }
  }

  // Insert `row` into `body` in name order.
  function place(body, row) {
    var name = row.getAttribute("data-name");
    var next = null;
    for (var i = 0; i < body.children.length; i++) {
      if (body.children[i].getAttribute("data-name") > name) {
        next = body.children[i];
        break;
      }
    }
    body.insertBefore(row, next);
  }

  function follow(pre) {
    var url = pre.getAttribute("data-follow");
    if (!url) return;
    var es = new EventSource(url);
    pre.setAttribute("data-following", "1");
    es.addEventListener("output", function (e) {
      var atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.appendChild(document.createTextNode(e.data));
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    });
    es.addEventListener("end", function (e) {
      es.close();
      pre.removeAttribute("data-following");
      var d = JSON.parse(e.data);
      var said = document.getElementById("run-end");
      if (said) said.textContent = "Run " + d.run + " ended: " + (d.result || "gone") + ".";
      var heading = document.getElementById("run-heading");
      if (heading) heading.textContent = "Last run: run " + d.run + " (" + (d.result || "gone") + ")";
      var result = document.getElementById("run-result");
      if (result) result.textContent = d.result || "gone";
    });
    es.addEventListener("gone", function () {
      es.close();
    });
  }

  // On a target's page: a run that starts is shown and followed.
  function followNew(run) {
    var pre = document.getElementById("output");
    if (pre && pre.getAttribute("data-run") === String(run)) return;
    if (pre && pre.getAttribute("data-following")) return;
    var h = document.createElement("h2");
    h.id = "run-heading";
    h.textContent = "Running now: run " + run;
    var oldHeading = document.getElementById("run-heading");
    if (oldHeading) oldHeading.remove();
    var fresh = document.createElement("pre");
    fresh.id = "output";
    fresh.className = "output";
    fresh.setAttribute("data-run", String(run));
    fresh.setAttribute("data-follow", "/runs/" + run + "/events");
    var end = document.createElement("p");
    end.id = "run-end";
    var old = document.getElementById("run-end");
    if (pre) pre.remove();
    if (old) old.remove();
    var board = document.getElementById("board");
    board.after(h, fresh, end);
    follow(fresh);
  }

  function rows(board) {
    var url = board.getAttribute("data-events");
    if (!url || !window.EventSource) return;
    var single = document.getElementById("g-one");
    var es = new EventSource(url);
    es.addEventListener("row", function (e) {
      var d = JSON.parse(e.data);
      var holder = document.createElement("tbody");
      holder.innerHTML = d.html;
      var row = holder.firstElementChild;
      if (!row) return;
      var old = document.getElementById("t-" + d.name);
      if (single) {
        if (old) old.replaceWith(row);
        else single.appendChild(row);
        if (d.run) followNew(d.run);
      } else {
        var body = document.getElementById("g-" + d.group);
        if (!body) return;
        if (old) old.remove();
        place(body, row);
        counts();
      }
      times();
    });
    es.addEventListener("gone", function (e) {
      var old = document.getElementById("t-" + JSON.parse(e.data).name);
      if (old) old.remove();
      counts();
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var board = document.getElementById("board");
    if (board) rows(board);
    var pre = document.getElementById("output");
    if (pre) follow(pre);
    times();
    setInterval(times, 15000);
  });
})();
