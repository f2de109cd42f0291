// The compare page: each study's best-so-far history and its best trials' objective curves, on
// shared axes (one colour per study); points open their trial on click.
(function () {
  "use strict";
  var hpo = window.hpo;
  var form = document.getElementById("compare-form");
  if (form) form.addEventListener("submit", function () {
    var picked = Array.prototype.map.call(form.querySelectorAll('input[name="pick"]:checked'), function (c) { return c.value; });
    form.elements["studies"].value = picked.join(",");
    form.querySelectorAll('input[name="pick"]').forEach(function (c) { c.disabled = true; });
  });
  var root = document.getElementById("compare");
  if (!root || !root.dataset.studies) return;
  var ids = root.dataset.studies.split(",").filter(Boolean);
  var history = root.querySelector('[data-chart="compare-history"]');
  var curves = root.querySelector('[data-chart="compare-curves"]');

  Promise.all(ids.map(function (id) { return hpo.getJSON("/api/v1/studies/" + id + "/charts/history"); })).then(function (all) {
    var traces = all.map(function (d, i) {
      return { type: "scatter", mode: "lines", x: d.best.x, y: d.best.y, name: d.study + " (" + d.metric + ")",
        line: { shape: "hv", color: hpo.COLORS[i % hpo.COLORS.length], width: 2 } };
    }).filter(function (t) { return t.x.length; });
    if (!traces.length) return hpo.empty(history, "No completed trials yet.");
    return hpo.draw(history, traces, hpo.layout({ xaxis: { title: { text: "trial number" } }, yaxis: { title: { text: "best so far" } } }), "compare-history");
  }).catch(function (e) { hpo.failed(history, e); });

  Promise.all(ids.map(function (id) { return hpo.getJSON("/api/v1/studies/" + id + "/charts/curves?limit=3&points=200"); })).then(function (all) {
    var traces = [];
    all.forEach(function (d, i) {
      d.curves.forEach(function (c) {
        traces.push({ type: "scatter", mode: "lines", x: c.steps, y: c.values, name: d.study + ": trial " + c.id,
          customdata: c.steps.map(function () { return c.id; }), text: c.steps.map(function () { return d.study + "<br>" + c.text; }),
          hovertemplate: "%{text}<br>step %{x}: %{y:.4g}<extra></extra>", line: { color: hpo.COLORS[i % hpo.COLORS.length], width: 1.5 } });
      });
    });
    if (!traces.length) return hpo.empty(curves, "No curves reported yet.");
    return hpo.draw(curves, traces, hpo.layout({ height: 420, xaxis: { title: { text: "step" } }, yaxis: { title: { text: "objective" } } }), "compare-curves");
  }).catch(function (e) { hpo.failed(curves, e); });
})();
