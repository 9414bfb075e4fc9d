// latchkey console: a little help on top of plain forms (every page works without it).
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  // Ask before a form marked data-confirm is sent.
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.getAttribute("data-confirm"))) {
        event.preventDefault();
      }
    });
  });
  // An input marked data-filter hides the rows of the table after it that do not contain its text.
  document.querySelectorAll("input[data-filter]").forEach(function (input) {
    var table = document.getElementById(input.getAttribute("data-filter"));
    if (!table) {
      return;
    }
    input.addEventListener("input", function () {
      var needle = input.value.toLowerCase();
      table.querySelectorAll("tbody tr").forEach(function (row) {
        row.classList.toggle("hidden", needle !== "" && row.textContent.toLowerCase().indexOf(needle) < 0);
      });
    });
  });
  // A file input marked data-load puts the chosen file's text into the textarea it names (the
  // file itself is never sent: the input has no name). At most 1 MiB, as the server reads.
  document.querySelectorAll("input[type=file][data-load]").forEach(function (input) {
    var target = document.getElementById(input.getAttribute("data-load"));
    if (!target || !window.FileReader) {
      return;
    }
    input.addEventListener("change", function () {
      var file = input.files && input.files[0];
      if (!file) {
        return;
      }
      if (file.size > 1024 * 1024) {
        window.alert("larger than 1 MiB: the console compares policies up to 1 MiB");
        input.value = "";
        return;
      }
      var reader = new FileReader();
      reader.onload = function () {
        target.value = String(reader.result);
      };
      reader.readAsText(file);
    });
  });
  // The traffic page: records from the live stream, newest first, at most 500 rows.
  var state = document.getElementById("traffic-state");
  var traffic = document.getElementById("traffic");
  if (state && traffic && window.EventSource) {
    var tbody = traffic.querySelector("tbody");
    var cell = function (row, text) {
      var td = document.createElement("td");
      td.textContent = text === null || text === undefined ? "—" : String(text);
      row.appendChild(td);
    };
    var explainLink = function (r) {
      if (!r.host || !r.method || !r.scheme) {
        return null;
      }
      var port = r.port && !((r.scheme === "https" && r.port === 443) || (r.scheme === "http" && r.port === 80)) ? ":" + r.port : "";
      var url = r.scheme + "://" + r.host + port + (r.path || "/");
      var q = new URLSearchParams({ method: r.method, url: url, identity: r.identity });
      var a = document.createElement("a");
      a.href = "/ui/explain?" + q.toString();
      a.textContent = "explain this request";
      return a;
    };
    var source = new EventSource(state.getAttribute("data-stream"));
    source.addEventListener("open", function () {
      state.textContent = "live: new requests appear as they are written to the audit log";
      state.className = "state live";
    });
    source.addEventListener("error", function () {
      state.textContent = "the stream dropped; reconnecting…";
      state.className = "state down";
    });
    source.addEventListener("missed", function (event) {
      var data = JSON.parse(event.data);
      var row = document.createElement("tr");
      row.className = "missed";
      var td = document.createElement("td");
      td.colSpan = 10;
      td.textContent = data.missed + " records went by while this page was behind";
      row.appendChild(td);
      tbody.insertBefore(row, tbody.firstChild);
    });
    source.addEventListener("record", function (event) {
      var r = JSON.parse(event.data);
      var row = document.createElement("tr");
      row.className = "record " + (r.decision === "deny" ? "deny" : "allow");
      row.setAttribute("data-id", r.id);
      [r.ts, r.identity, r.session, r.method, r.host, r.path, r.decision, r.reason, r.status, r.rule].forEach(function (v) {
        cell(row, v);
      });
      row.addEventListener("click", function () {
        var next = row.nextSibling;
        if (next && next.className === "detail") {
          next.remove();
          return;
        }
        var detail = document.createElement("tr");
        detail.className = "detail";
        var td = document.createElement("td");
        td.colSpan = 10;
        var link = explainLink(r);
        if (link) {
          td.appendChild(link);
        }
        var pre = document.createElement("pre");
        pre.textContent = JSON.stringify(r, null, 2);
        td.appendChild(pre);
        detail.appendChild(td);
        row.parentNode.insertBefore(detail, row.nextSibling);
      });
      tbody.insertBefore(row, tbody.firstChild);
      while (tbody.querySelectorAll("tr.record").length > 500) {
        tbody.removeChild(tbody.lastChild);
      }
    });
  }
});
