/* Once loaded: what rendered (sections, drawn plots, script errors, fetched resources) as data-*
   attributes of <body> and of each section, which the tests read from a headless browser. */
window.addEventListener("load", function () {
  var drawn = function (el) { var r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  var body = document.body, sections = document.querySelectorAll("section.experiment");
  var plots = document.querySelectorAll("figure.plot"), ok = 0, shown = 0;
  plots.forEach(function (f) {
    var svg = f.querySelector("svg");
    var yes = svg !== null && drawn(svg) && svg.querySelectorAll("path, use, text").length > 0;
    f.dataset.drawn = yes ? "1" : "0";
    if (yes) { ok += 1; }
  });
  sections.forEach(function (s) {
    var r = s.getBoundingClientRect();
    s.dataset.top = Math.round(r.top + window.scrollY);
    s.dataset.height = Math.round(r.height);
    if (drawn(s)) { shown += 1; }
    s.dataset.plotsDrawn = s.querySelectorAll('figure.plot[data-drawn="1"]').length;
  });
  body.dataset.height = document.documentElement.scrollHeight;
  body.dataset.sections = sections.length;
  body.dataset.sectionsDrawn = shown;
  body.dataset.plots = plots.length;
  body.dataset.plotsDrawn = ok;
  body.dataset.resources = performance.getEntriesByType("resource").length;
  body.dataset.errors = window.__reportErrors.length;
  body.dataset.errorText = window.__reportErrors.join(" | ");
  body.dataset.ready = "1";
});
