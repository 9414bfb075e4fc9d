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
});
