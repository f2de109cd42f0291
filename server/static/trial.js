// The trial page: one chart per metric the trial reported (log-y for losses, robust limits, the
// best step starred, the clip threshold on the gradient norm), redrawn every 5 s while it runs.
(function () {
  "use strict";
  var root = document.getElementById("trial");
  if (!root) return;
  var hpo = window.hpo;
  var id = root.dataset.trialId;
  var box = document.getElementById("trial-curves");

  function chartFor(name, alias) {
    var div = box.querySelector('[data-chart="' + CSS.escape(name) + '"]');
    if (div) return div;
    var fig = document.createElement("figure");
    fig.className = "chart";
    var cap = document.createElement("figcaption");
    cap.textContent = name + (alias ? " (" + alias + " in analysis.aliases)" : "");
    div = document.createElement("div");
    div.className = "plot";
    div.dataset.chart = name;
    fig.appendChild(cap);
    fig.appendChild(div);
    box.appendChild(fig);
    return div;
  }

  // The names the analysis reads that this trial did not report, said in words under the charts.
  function sayMissing(d) {
    var list = document.getElementById("trial-missing");
    if (!list) return;
    list.innerHTML = "";
    (d.missing || []).forEach(function (m) {
      var li = document.createElement("li");
      li.textContent = m.message;
      li.dataset.name = m.name;
      list.appendChild(li);
    });
  }

  function render(d) {
    sayMissing(d);
    if (!d.metrics.length) {
      box.innerHTML = "";
      var p = document.createElement("p");
      p.className = "empty";
      p.textContent = d.status === "pending" ? "Not started yet." : "No metrics reported yet.";
      box.appendChild(p);
      document.body.dataset.chartsSettled = "0";
      document.body.dataset.chartsTotal = "0";
      document.body.dataset.chartsReadyAt = String(Math.round(performance.now()));
      return Promise.resolve();
    }
    var loading = box.querySelector("p.empty");
    if (loading) loading.remove();
    return Promise.all(d.metrics.map(function (m) {
      var div = chartFor(m.name, m.alias);
      var text = m.steps.map(function (s, i) { return "trial " + d.trial_id + "<br>step " + s + ": " + hpo.fmt(m.values[i]); });
      var traces = [{ type: "scatter", mode: "lines", x: m.steps, y: m.values, text: text, name: m.name,
        hovertemplate: "%{text}<extra></extra>", line: { color: hpo.COLORS[0], width: 1.5 } }];
      var shapes = [];
      if (m.name === d.objective && d.best_step !== null) {
        var at = m.steps.indexOf(d.best_step);
        var j = at >= 0 ? at : m.steps.reduce(function (b, s, i) { return Math.abs(s - d.best_step) < Math.abs(m.steps[b] - d.best_step) ? i : b; }, 0);
        traces.push({ type: "scatter", mode: "markers", x: [m.steps[j]], y: [m.values[j]], name: "best step " + d.best_step,
          marker: { symbol: "star", size: 14, color: "gold", line: { color: "#000", width: 1 } }, hoverinfo: "name" });
      }
      if (m.name === d.grad_norm_metric && d.grad_clip_norm) {
        shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: d.grad_clip_norm, y1: d.grad_clip_norm,
          line: { color: hpo.INFEASIBLE, dash: "dot" } });
      }
      var yaxis = { title: { text: m.name + (m.log_y ? " (log)" : "") }, type: m.log_y ? "log" : "linear" };
      if (m.y_range) yaxis.range = m.y_range;
      return hpo.draw(div, traces, hpo.layout({ height: 300, showlegend: traces.length > 1, shapes: shapes,
        xaxis: { title: { text: "step" } }, yaxis: yaxis }), "trial-" + id + "-" + m.name.replace(/\W+/g, "_"));
    }));
  }

  function refresh() {
    return hpo.getJSON("/api/v1/trials/" + id + "/curves").then(function (d) {
      var status = document.getElementById("trial-status");
      if (status.textContent !== d.status) {
        status.textContent = d.status;
        status.className = "status " + d.status;
      }
      var live = d.status === "running" || d.status === "pending";
      root.dataset.live = live ? "1" : "0";
      var badge = document.getElementById("live-badge");
      if (badge && !live) badge.textContent = "(finished: reload for the final numbers)";
      return render(d);
    }).catch(function (e) { box.textContent = "Could not load the curves: " + e.message; });
  }

  function tick() {
    if (root.dataset.live !== "1") return;
    (document.hidden ? Promise.resolve() : refresh()).then(function () { setTimeout(tick, 5000); });
  }

  refresh().then(function () { setTimeout(tick, 5000); });
})();
