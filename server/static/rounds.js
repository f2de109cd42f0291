// The pipeline and round pages: each chart reads the endpoint whose answer it draws
// (GET /api/v1/pipelines/{id}: the launch history; GET /api/v1/rounds/{id}: the evidence).
(function () {
  "use strict";
  var hpo = window.hpo;

  function launches(root) {
    var box = root.querySelector('[data-chart="launches"]');
    var metric = root.dataset.metric;
    return hpo.getJSON("/api/v1/pipelines/" + root.dataset.pipelineId).then(function (p) {
      // a level is a number or {value, mean, n, ...}: the replicas' mean where measured
      var level = function (o) { return o && typeof o === "object" ? (o.mean !== null && o.mean !== undefined ? o.mean : o.value) : o; };
      var xs = [0], ys = [null], text = ["before any launch"];
      var first = p.launches[0];
      if (first) ys[0] = first.objective_before;
      if (!first && p.baseline.objective !== null) ys[0] = p.baseline.objective;
      p.launches.forEach(function (l, i) {
        xs.push(i + 1);
        ys.push(level(l.objective_after));
        var changed = Object.keys(l.params_changed).map(function (k) {
          return k + ": " + hpo.fmt(l.params_changed[k].before) + " → " + hpo.fmt(l.params_changed[k].after);
        });
        text.push("launch " + (i + 1) + " (round " + l.round_id + ")<br>" + changed.join("<br>"));
      });
      ys = ys.map(level);
      if (ys.every(function (y) { return y === null || y === undefined; })) return hpo.empty(box, "No baseline measured yet.");
      return hpo.draw(box, [{ type: "scatter", mode: "lines+markers", x: xs, y: ys, text: text,
        hovertemplate: "%{text}<br>" + metric + " = %{y:.4g}<extra></extra>", line: { shape: "hv" }, name: metric }],
        hpo.layout({ showlegend: false, xaxis: { title: { text: "launch" }, dtick: 1 }, yaxis: { title: { text: metric } } }), "launches");
    }).catch(function (e) { hpo.failed(box, e); });
  }

  function evidence(root) {
    var box = root.querySelector('[data-chart="evidence"]');
    if (!box) return Promise.resolve();
    return hpo.getJSON("/api/v1/rounds/" + root.dataset.roundId).then(function (r) {
      var ev = r.evidence || {};
      var sides = ["candidate", "baseline"].filter(function (s) { return ev[s] && ev[s].values && ev[s].values.length; });
      if (!sides.length) return hpo.empty(box, "No replicas yet: POST /api/v1/rounds/" + r.id + "/replicas runs seeds of both.");
      var traces = [];
      sides.forEach(function (s, i) {
        var side = ev[s];
        traces.push({ type: "scatter", mode: "markers", name: s + " runs", x: side.values.map(function () { return s; }), y: side.values,
          marker: { size: 9, color: hpo.COLORS[i], opacity: 0.8 }, hovertemplate: s + ": %{y:.4g}<extra></extra>" });
        if (side.mean !== null) {
          var err = side.ci ? { type: "data", symmetric: false, array: [side.ci[1] - side.mean], arrayminus: [side.mean - side.ci[0]], width: 12 } : undefined;
          traces.push({ type: "scatter", mode: "markers", name: s + " mean", x: [s], y: [side.mean], error_y: err,
            marker: { symbol: "line-ew-open", size: 28, color: "#333" }, hovertemplate: s + " mean %{y:.4g}<extra></extra>" });
        }
      });
      return hpo.draw(box, traces, hpo.layout({ showlegend: false, xaxis: { type: "category" },
        yaxis: { title: { text: "best value per run" } } }), "evidence");
    }).catch(function (e) { hpo.failed(box, e); });
  }

  var p = document.getElementById("pipeline");
  if (p) launches(p);
  var r = document.getElementById("round");
  if (r) evidence(r);
})();
