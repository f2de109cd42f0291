// The study page: draws each chart from its JSON endpoint with Plotly, keeps the progress box
// live by polling the cheap progress endpoint, and redraws charts and the table when a trial
// starts or finishes. The trial table is sorted, filtered and paged on the server.
(function () {
  "use strict";
  var root = document.getElementById("study");
  if (!root) return;
  var hpo = window.hpo;
  var id = root.dataset.studyId;
  var metric = root.dataset.metric;
  var api = "/api/v1/studies/" + id;
  var HOVER = "%{text}<extra></extra>";

  function el(kind) { return root.querySelector('[data-chart="' + kind + '"]'); }

  // SVG keeps every point in the DOM (and testable); past a few thousand points WebGL draws
  // them without freezing the page.
  // (measured on a 5,000-trial study: one SVG chart of 5,000 points draws faster than starting
  // WebGL without a GPU, three panels of 5,000 do not).
  function scatterType(n, limit) { return n > (limit === null || limit === undefined ? 10000 : limit) ? "scattergl" : "scatter"; }

  function withText(s, texts) { s.text = s.ids.map(function (i) { return texts[i]; }); return s; }

  function markers(s, color, symbol, limit) {
    return {
      type: scatterType(s.x.length, limit), mode: "markers", name: s.name, x: s.x, y: s.y, customdata: s.ids, text: s.text,
      hovertemplate: HOVER, marker: { color: color, size: symbol ? 9 : 7, symbol: symbol || "circle", opacity: 0.85 },
    };
  }

  function infeasibleTrace(inf) {
    var t = markers({ name: "infeasible", x: inf.x, y: inf.y, ids: inf.ids, text: inf.text }, hpo.INFEASIBLE, "x");
    return t;
  }

  // --- charts ------------------------------------------------------------------------------

  var draw = {};

  // A chart thinned on the server (past a few thousand points) says so in its caption, and says
  // it again when a redraw (another contour pair or arm) thins differently or not at all.
  function noteThinned(box, shown, total) {
    var caption = box.parentElement.querySelector("figcaption");
    if (!caption) return;
    var note = caption.querySelector(".thinned");
    if (shown >= total) { if (note) note.remove(); return; }
    if (!note) { note = document.createElement("span"); note.className = "thinned"; caption.appendChild(note); }
    note.textContent = " — " + shown + " of " + total + " points drawn: the best 1,000 and an even sample";
  }

  draw.history = function (d, box) {
    if (!d.n_trials) return hpo.empty(box, "No trials have run yet.");
    if (d.shown !== undefined) noteThinned(box, d.shown, d.n_points);
    if (!d.n_feasible && !d.infeasible.x.length) return hpo.empty(box, "No completed trials yet.");
    var traces = d.series.map(function (s, i) { return markers(withText(s, d.text), hpo.COLORS[i % hpo.COLORS.length]); });
    if (d.infeasible.x.length) traces.push(infeasibleTrace(withText(d.infeasible, d.text)));
    if (d.replicas && d.replicas.x.length) {  // at their original's number, hollow: never the best so far
      var rep = markers(withText({ name: "replicas", x: d.replicas.x, y: d.replicas.y, ids: d.replicas.ids }, d.text), "#555", "circle-open");
      traces.push(rep);
    }
    traces.push({ type: "scatter", mode: "lines", name: "best so far", x: d.best.x, y: d.best.y,
      line: { shape: "hv", color: "#333", width: 1.5 }, hoverinfo: "skip" });
    return hpo.draw(box, traces, hpo.layout({ xaxis: { title: { text: "trial number" } }, yaxis: { title: { text: metric } } }), "history");
  };

  // Panels draw as they come near the viewport (as whole charts do): on a first visit only the
  // panels in view cost a draw (the axis chart's five panels took 0.9 s of a 2.3 s first visit at
  // 5,000 trials), and one panel per task (a macrotask between them), so a chart of several big
  // panels never holds the main thread for their sum (one 2.7 s task at 50,000 trials).
  // The chart counts as drawn once the panels in view are.
  function panels(box, items, drawOne) {
    if (box._panelWatch) box._panelWatch.disconnect();
    box.innerHTML = "";
    var t0 = performance.now();
    var specs = items.map(drawOne);
    var total = specs.reduce(function (n, spec) {
      return n + spec.traces.reduce(function (k, t) { return k + (t.x ? t.x.length : 0); }, 0);
    }, 0);
    var divs = specs.map(function (spec) {
      var div = document.createElement("div");
      div.className = "plot panel";
      div.style.minHeight = ((spec.layout && spec.layout.height) || 320) + "px";
      box.appendChild(div);
      return div;
    });
    function drawPanel(i) {
      var div = divs[i], spec = specs[i];
      if (div.dataset.drawn) return Promise.resolve();
      div.dataset.drawn = "1";
      return hpo.plot(div, spec.traces, spec.layout, hpo.config(spec.name)).then(function () {
        div.on("plotly_click", function (ev) {
          var p = ev && ev.points && ev.points[0];
          if (p && p.customdata) window.location.href = "/trials/" + p.customdata;
        });
      });
    }
    function near(div) {
      var r = div.getBoundingClientRect();
      return r.top < window.innerHeight + 200 && r.bottom > -200;
    }
    var first = divs.map(function (div, i) { return near(div) ? i : -1; }).filter(function (i) { return i >= 0; });
    if (!first.length) first = [0];
    var chain = Promise.resolve();
    first.forEach(function (i) {
      chain = chain.then(function () { return drawPanel(i); })
        .then(function () { return new Promise(function (resolve) { setTimeout(resolve, 0); }); });
    });
    return chain.then(function () {
      var later = Promise.resolve();
      var watch = new IntersectionObserver(function (entries) {
        entries.forEach(function (entry) {
          if (!entry.isIntersecting) return;
          watch.unobserve(entry.target);
          var i = divs.indexOf(entry.target);
          later = later.then(function () { return drawPanel(i); });
        });
      }, { rootMargin: "200px" });
      divs.forEach(function (div) { if (!div.dataset.drawn) watch.observe(div); });
      box._panelWatch = watch;
      box.dataset.rendered = "1";
      box.dataset.drawMs = String(Math.round(performance.now() - t0));
      box.dataset.points = String(total);
      box.dataset.panels = String(divs.length);
      box.dataset.empty = "0";
      hpo.settled();
    });
  }

  draw.axis = function (d, box) {
    if (!d.panels.length) return hpo.empty(box, "No varied hyperparameters: nothing to plot against.");
    var any = d.panels.some(function (p) { return p.series.length || p.infeasible.x.length; });
    if (!any) return hpo.empty(box, "No completed trials yet.");
    var thinned = d.panels.filter(function (p) { return p.shown < p.n_points; })[0];
    if (thinned) noteThinned(box, thinned.shown, thinned.n_points);
    return panels(box, d.panels, function (p) {
      var n = p.series.reduce(function (k, s) { return k + s.x.length; }, 0);
      var traces = p.series.map(function (s, i) { return markers(withText(s, d.text), hpo.COLORS[i % hpo.COLORS.length], null, n > 10000 ? 0 : null); });
      if (p.infeasible.x.length) traces.push(infeasibleTrace(withText(p.infeasible, d.text)));
      if (p.replicas && p.replicas.x.length) {  // hollow, as in the history chart: drawn, never ranked
        traces.push(markers(withText({ name: "replicas", x: p.replicas.x, y: p.replicas.y, ids: p.replicas.ids }, d.text), "#555", "circle-open"));
      }
      var shapes = (p.bounds || []).map(function (b) {
        return { type: "line", xref: "x", yref: "paper", x0: b, x1: b, y0: 0, y1: 1, line: { dash: "dash", color: "#999", width: 1 } };
      });
      var xaxis = { title: { text: p.param + " (" + p.role + ")" }, type: p.axis_type };
      if (p.categories) { xaxis.categoryorder = "array"; xaxis.categoryarray = p.categories; }
      return {
        traces: traces, name: "axis-" + p.name,
        layout: hpo.layout({ height: 320, shapes: shapes, xaxis: xaxis, yaxis: { title: { text: metric } },
          showlegend: traces.length > 1, margin: { l: 64, r: 12, t: 12, b: 48 } }),
      };
    });
  };

  draw.isolation = function (d, box) {
    var series = d.series.filter(function (s) { return s.x.length; });
    if (!series.length) return hpo.empty(box, d.series.length ? "No completed trials yet." : "No scientific hyperparameters.");
    return panels(box, series, function (s) {
      var text = s.x.map(function (x, i) {
        var ci = s.ci[i] ? "<br>95% CI [" + hpo.fmt(s.ci[i][0]) + ", " + hpo.fmt(s.ci[i][1]) + "]" : "";
        var sd = s.std[i] !== null ? "<br>replica std " + hpo.fmt(s.std[i]) : "<br>no replicas: trial variance unknown";
        return "trial " + s.ids[i] + "<br>" + x + "<br>best " + metric + " = " + hpo.fmt(s.y[i]) + sd + ci + "<br>" + s.n[i] + " trials";
      });
      var trace = { type: "scatter", mode: s.kind === "buckets" || s.ordered ? "lines+markers" : "markers", x: s.x, y: s.y, customdata: s.ids,
        text: text, hovertemplate: HOVER, name: s.param, marker: { size: 10, color: hpo.COLORS[0] },
        error_y: { type: "data", array: s.std.map(function (v) { return v || 0; }), visible: true, thickness: 1.5, width: 6 } };
      var title = s.param + (s.label && s.label !== "all trials" ? " (" + s.label + ")" : "");
      // Without replicas nothing says how big a gap noise makes: say so rather than zoom into it.
      var unknown = s.std.every(function (v) { return v === null; });
      var notes = unknown ? [{ text: "no replicas: trial variance unknown, a small gap may be noise", xref: "paper", yref: "paper",
        x: 0, y: 1.06, showarrow: false, xanchor: "left", font: { size: 11, color: "#a15c00" } }] : [];
      return { traces: [trace], name: "isolation", layout: hpo.layout({ height: 320, showlegend: false, annotations: notes,
        xaxis: { title: { text: title }, type: s.kind === "arms" ? "category" : "linear", automargin: true },
        yaxis: { title: { text: "best " + metric }, automargin: true } }) };
    });
  };

  draw.importance = function (d, box) {
    var armSelect = box.parentElement.querySelector('[data-importance="arm"]');
    if (armSelect && !armSelect.dataset.bound) {
      armSelect.dataset.bound = "1";
      armSelect.addEventListener("change", function () { load("importance"); });
    }
    var caption = box.parentElement.querySelector("[data-method]");
    if (caption) caption.textContent = "— " + d.method;
    if (!d.params.length) return hpo.empty(box, d.message || "No completed trials yet.");
    var ps = d.params.slice().reverse();
    return hpo.draw(box, [{ type: "bar", orientation: "h", x: ps.map(function (p) { return p.importance; }),
      y: ps.map(function (p) { return p.name; }), customdata: ps.map(function (p) { return p.n; }), error_x: { type: "data", array: ps.map(function (p) { return p.std; }) },
      marker: { color: hpo.COLORS[0] }, hovertemplate: "%{y}: %{x:.3g} (over %{customdata} trials)<extra></extra>", name: "importance" }],
      hpo.layout({ showlegend: false, yaxis: { automargin: true }, margin: { l: 140, r: 16, t: 12, b: 48 },
        xaxis: { title: { text: "drop in R² when shuffled (" + d.n + " trials)" } } }), "importance");
  };

  draw.parallel = function (d, box) {
    if (d.n < 2) return hpo.empty(box, d.n ? "Only one completed trial so far." : "No completed trials yet.");
    var caption = box.parentElement.querySelector("figcaption");
    if (d.n < d.n_feasible && caption && !caption.dataset.noted) {
      caption.dataset.noted = "1";
      caption.appendChild(document.createTextNode(" — the best " + d.n + " of " + d.n_feasible + " completed trials"));
    }
    var dims = d.axes.map(function (a) {
      var dim = { label: a.label, values: a.values };
      if (a.range) dim.range = a.range;
      if (a.tickvals) { dim.tickvals = a.tickvals; dim.ticktext = a.ticktext; }
      return dim;
    });
    var reverse = root.dataset.mode === "max";
    return hpo.draw(box, [{ type: "parcoords", dimensions: dims, customdata: d.ids,
      line: { color: d.color, colorscale: "Viridis", reversescale: !reverse, showscale: true,
        colorbar: { title: { text: metric } } } }],
      hpo.layout({ height: 400, margin: { l: 60, r: 80, t: 48, b: 24 } }), "parallel").then(function () {
      if (box.dataset.brushing) return;
      box.dataset.brushing = "1";
      // Smart selection: a range brushed on a hyperparameter's axis filters the trial table.
      box.on("plotly_restyle", function () {
        var trace = box.data && box.data[0];
        if (!trace || !hpo.filterTableByRange) return;
        d.axes.forEach(function (a, i) {
          var dim = trace.dimensions[i];
          if (!a.param || a.categorical || !dim) return;
          var r = dim.constraintrange;
          if (r && Array.isArray(r[0])) r = r[0];
          if (!r) return;
          var lo = a.not_applicable_at !== undefined ? Math.max(r[0], a.range[0] + (a.range[1] - a.range[0]) * 0.1) : r[0];
          var conv = function (v) { return Number((a.log ? Math.pow(10, v) : v).toPrecision(4)); };
          hpo.filterTableByRange(a.param, conv(lo), conv(r[1]));
        });
      });
    });
  };

  var contourChoice = {};
  draw.contour = function (d, box) {
    // the y choices are the hyperparameters defined in the same trials as x (`pairs`): two arms'
    // learning rates are never offered together
    var selects = box.parentElement.querySelectorAll("[data-contour]");
    selects.forEach(function (s) {
      var axis = s.dataset.contour;
      if (axis === "arm") {
        if (!s.dataset.bound) { s.dataset.bound = "1"; s.addEventListener("change", function () { contourChoice = { arm: s.value }; load("contour"); }); }
        return;
      }
      var options = axis === "x" ? d.choices : (d.pairs && d.x ? d.pairs[d.x] : d.choices);
      s.innerHTML = "";
      options.forEach(function (c) { var o = document.createElement("option"); o.textContent = c; s.appendChild(o); });
      if (!s.dataset.bound) {
        s.dataset.bound = "1";
        s.addEventListener("change", function () {
          contourChoice[axis] = s.value;
          if (axis === "x") delete contourChoice.y;
          load("contour");
        });
      }
      if (d[axis]) s.value = d[axis];
    });
    if (!d.points || !d.points.x.length) return hpo.empty(box, d.message || "No completed trials yet.");
    noteThinned(box, d.shown, d.n_points);
    var traces = [];
    if (d.grid) traces.push({ type: "contour", x: d.grid.x, y: d.grid.y, z: d.grid.z, colorscale: "Viridis",
      reversescale: root.dataset.mode !== "max", connectgaps: false, hoverinfo: "skip", contours: { coloring: "heatmap" },
      colorbar: { title: { text: metric } }, name: metric });
    traces.push({ type: scatterType(d.points.x.length), mode: "markers", x: d.points.x, y: d.points.y, customdata: d.points.ids,
      text: withText(d.points, d.text).text, hovertemplate: HOVER, name: "trials", marker: { color: "#fff", size: 7, line: { color: "#000", width: 1 } } });
    return hpo.draw(box, traces, hpo.layout({ showlegend: false, xaxis: { title: { text: d.x }, type: d.x_type },
      yaxis: { title: { text: d.y }, type: d.y_type } }), "contour");
  };

  // Timeline: one row per worker, a bar per attempt from its claim to its end, coloured by how it
  // ended (one trace per outcome, bars as thick line segments separated by gaps: one SVG path each).
  var TIMELINE_COLORS = { completed: hpo.COLORS[0], running: "#2ca02c", preempted: "#ff7f0e", expired: "#9467bd",
    error: "#8c564b", infeasible: hpo.INFEASIBLE, config: "#e377c2", cancelled: "#999", failed: "#8c564b", pending: "#bbb", unknown: "#666" };
  var TIMELINE_WORDS = { expired: "lease expired", config: "config error", pending: "requeued", unknown: "end not recorded" };
  // Past TIMELINE_MERGE_FROM bars a worker's row holds several attempts per pixel: consecutive
  // attempts of one outcome on one row less than a pixel's worth of time apart are drawn as one
  // segment (the same picture; its hover counts them), merged again for the range in view when the
  // person zooms. SVG then draws what needed WebGL and Plotly's full bundle, a 0.8-2.7 s task at
  // 50,000 trials. The box's data-merge-from overrides the threshold (the browser tests' hook).
  var TIMELINE_MERGE_FROM = 10000;

  function timelineLabel(d, i, straggler) {
    var b = d.bars, how = d.outcomes[b.outcome[i]], secs = b.end[i] - b.start[i];
    var which = b.attempt[i] === null ? (b.attempts[i] > 1 ? " (" + b.attempts[i] + " attempts, not recorded apart)" : "")
      : b.attempts[i] > 1 ? " · attempt " + b.attempt[i] + " of " + b.attempts[i] : "";
    return "trial " + b.ids[i] + (b.replica[i] ? " (replica)" : "") + which + "<br>" + d.workers[b.worker[i]].name + " · " +
      (TIMELINE_WORDS[how] || how) + " · " + hpo.duration(secs) +
      (straggler ? "<br>straggler: over " + hpo.fmt(secs / d.median_seconds) + "× the median attempt" : "");
  }

  // [{first, n, start, end}] per outcome, in bar order: runs of one outcome's bars on one row whose
  // gaps are at most `seconds` (0: every bar its own segment).
  function timelineSegments(d, seconds) {
    var b = d.bars, runs = {}, order = [];
    for (var i = 0; i < b.ids.length; i++) {
      var key = b.outcome[i] + "/" + b.worker[i];
      if (!runs[key]) { runs[key] = []; order.push(key); }
      runs[key].push(i);
    }
    var out = {};
    order.forEach(function (key) {
      var bars = runs[key].sort(function (p, q) { return b.start[p] - b.start[q]; }), cur = null;
      var list = out[b.outcome[bars[0]]] || (out[b.outcome[bars[0]]] = []);
      bars.forEach(function (i) {
        if (cur && seconds > 0 && b.start[i] - cur.end <= seconds) {
          cur.n += 1; cur.last = i; cur.end = Math.max(cur.end, b.end[i]);
        } else {
          cur = { first: i, last: i, n: 1, start: b.start[i], end: b.end[i] };
          list.push(cur);
        }
      });
    });
    return out;
  }

  function timelineTraces(d, seconds, width) {
    var b = d.bars, straggler = {}, marks = { x: [], y: [], text: [], ids: [] };
    d.stragglers.forEach(function (i) { straggler[i] = true; });
    var segments = timelineSegments(d, seconds), count = 0, traces = [];
    Object.keys(segments).forEach(function (o) { count += segments[o].length; });
    var gl = count > TIMELINE_MERGE_FROM;  // SVG up to 10,000 segments (WebGL without a GPU took 17 s at 5,000)
    d.outcomes.forEach(function (how, o) {
      if (!segments[o]) return;
      var t = { x: [], y: [], customdata: [], text: [] };
      segments[o].forEach(function (g) {
        var worker = d.workers[b.worker[g.first]].name, label;
        if (g.n === 1) {
          label = timelineLabel(d, g.first, straggler[g.first]);
          t.customdata.push(b.ids[g.first], b.ids[g.first], null);
        } else {
          label = g.n + " attempts, trials " + b.ids[g.first] + " to " + b.ids[g.last] + "<br>" + worker + " · " +
            (TIMELINE_WORDS[how] || how) + " · " + hpo.duration(g.end - g.start) + "<br>zoom in to see each";
          t.customdata.push(null, null, null);
        }
        t.x.push(d.t0 + 1000 * g.start, d.t0 + 1000 * g.end, null); t.y.push(worker, worker, null); t.text.push(label, label, "");
      });
      traces.push({ type: gl ? "scattergl" : "scatter", mode: "lines", name: TIMELINE_WORDS[how] || how, x: t.x, y: t.y,
        customdata: t.customdata, text: t.text, hovertemplate: "%{text}<extra></extra>", connectgaps: false,
        line: { color: TIMELINE_COLORS[how] || "#666", width: width } });
    });
    d.stragglers.forEach(function (i) {
      marks.x.push(d.t0 + 1000 * b.end[i]); marks.y.push(d.workers[b.worker[i]].name); marks.ids.push(b.ids[i]);
      marks.text.push(timelineLabel(d, i, true));
    });
    if (marks.x.length) traces.push({ type: "scatter", mode: "markers", name: "straggler", x: marks.x, y: marks.y, customdata: marks.ids,
      text: marks.text, hovertemplate: "%{text}<extra></extra>", marker: { symbol: "triangle-left", size: 8, color: "#d62728" } });
    return traces;
  }

  // The seconds one pixel of the plot stands for over [lo, hi] (seconds after t0), or 0 when the
  // study has too few bars to merge.
  function timelinePixel(d, box, lo, hi) {
    var from = Number(box.dataset.mergeFrom || TIMELINE_MERGE_FROM);
    if (d.bars.ids.length <= from) return 0;
    return Math.max(0, hi - lo) / Math.max(200, box.clientWidth - 160);  // less the margins
  }

  draw.timeline = function (d, box) {
    if (!d.n) return hpo.empty(box, "No trial has started yet.");
    var b = d.bars, ended = {}, lo = Infinity, hi = -Infinity;
    for (var i = 0; i < b.ids.length; i++) {
      var how = d.outcomes[b.outcome[i]];
      ended[how] = (ended[how] || 0) + 1;
      lo = Math.min(lo, b.start[i]); hi = Math.max(hi, b.end[i]);
    }
    var names = d.workers.map(function (w) { return w.name; });
    var width = Math.max(3, Math.min(14, 240 / Math.max(1, names.length)));
    var idle = d.workers.filter(function (w) { return w.busy_fraction !== null && w.busy_fraction < 0.5; }).length;
    var interrupted = ["preempted", "expired", "error"].filter(function (how) { return ended[how]; })
      .map(function (how) { return ended[how] + " " + (TIMELINE_WORDS[how] || how); });
    var caption = box.parentElement.querySelector("[data-timeline-note]");
    var count = function (n, what) { return n + " " + what + (n === 1 ? "" : "s"); };
    if (caption) caption.textContent = count(d.workers.length, "worker") + ", " + count(d.n, "attempt") + " of " + count(d.n_trials, "trial") +
      (idle ? ", " + count(idle, "worker") + " busy under half the time" : "") + (interrupted.length ? ", " + interrupted.join(", ") : "") +
      (d.stragglers.length ? ", " + count(d.stragglers.length, "straggler") : "");
    var layout = hpo.layout({ height: Math.min(600, 120 + 28 * names.length), xaxis: { type: "date", title: { text: "wall-clock time" } },
      yaxis: { type: "category", categoryorder: "array", categoryarray: names.slice().reverse(), automargin: true } });
    box._timeline = { d: d, lo: lo, hi: hi, width: width, merged: null };
    return timelineDraw(box, layout, lo, hi);
  };

  // Draws the timeline merged for [lo, hi] and, while it merges, merges again as the view zooms.
  function timelineDraw(box, layout, lo, hi) {
    var t = box._timeline, pixel = timelinePixel(t.d, box, lo, hi);
    t.merged = lo + ":" + hi;
    return hpo.draw(box, timelineTraces(t.d, pixel, t.width), layout, "timeline").then(function () {
      box.dataset.merged = pixel > 0 ? t.merged : "";
      if (pixel === 0 || box._remergeFor === box._hpoPlotly) return;
      box._remergeFor = box._hpoPlotly;  // a switch of Plotly bundle purges the chart's listeners
      box.on("plotly_relayout", function (ev) {
        var now = box._timeline, from = now.lo, to = now.hi;
        // a drag answers the range's ends, Plotly.relayout the range; a date axis as naive UTC strings
        var range = ev["xaxis.range"] || (ev["xaxis.range[0]"] !== undefined ? [ev["xaxis.range[0]"], ev["xaxis.range[1]"]] : null);
        var seconds = function (v) {
          if (typeof v === "number") return (v - now.d.t0) / 1000;
          var text = String(v).replace(" ", "T");
          return (Date.parse(text.indexOf("T") < 0 ? text + "T00:00Z" : text + "Z") - now.d.t0) / 1000;
        };
        if (range) {
          from = seconds(range[0]); to = seconds(range[1]);
          if (!isFinite(from) || !isFinite(to)) return;
        } else if (!ev["xaxis.autorange"]) {
          return;
        }
        if (from + ":" + to !== now.merged) timelineDraw(box, box.layout, from, to);
      });
    });
  }

  draw.best_steps = function (d, box) {
    if (!d.fractions.length) return hpo.empty(box, "No completed trials yet.");
    var bins = { start: 0, end: 1, size: 0.05 };
    var traces = [{ type: "histogram", x: d.fractions, xbins: bins, name: "all trials", marker: { color: "#bbb" } }];
    if (d.top_fractions.length) traces.push({ type: "histogram", x: d.top_fractions, xbins: bins, name: "best trials", marker: { color: hpo.COLORS[0] } });
    var shade = function (x0, x1, color) { return { type: "rect", xref: "x", yref: "paper", x0: x0, x1: x1, y0: 0, y1: 1, fillcolor: color, opacity: 0.1, line: { width: 0 } }; };
    return hpo.draw(box, traces, hpo.layout({ barmode: "overlay", shapes: [shade(0, 0.1, hpo.INFEASIBLE), shade(0.75, 1, hpo.COLORS[0])],
      xaxis: { title: { text: "best step / max_train_steps (" + hpo.fmt(d.max_train_steps) + ")" }, range: [0, 1] },
      yaxis: { title: { text: "trials" } } }), "best_steps");
  };

  draw.budget = function (d, box) {
    if (!d.series.length) return hpo.empty(box, "No finished trials yet.");
    var traces = [];
    d.series.forEach(function (s, i) {
      var color = hpo.COLORS[i % hpo.COLORS.length];
      var worst = function (q) { return s[q].map(function (v) { return v === null ? NaN : v; }); };
      traces.push({ type: "box", name: s.label + (s.flattened ? " (flattened)" : " (not flattened)"), x: s.k,
        q1: worst("p25"), median: worst("median"), q3: worst("p75"), lowerfence: worst("p5"), upperfence: worst("p95"),
        marker: { color: color }, offsetgroup: String(i), hoverinfo: "x+y" });
      traces.push({ type: "scatter", mode: "lines", x: s.k, y: s.mean, name: "expected best, " + s.label, line: { color: color, dash: "dot" } });
    });
    return hpo.draw(box, traces, hpo.layout({ boxmode: "group", xaxis: { title: { text: "number of trials k" } },
      yaxis: { title: { text: "best " + metric + " of k (p5–p95)" } } }), "budget");
  };

  var curveOptions = function () {
    var fig = el("curves").parentElement;
    var get = function (name) { return fig.querySelector('[data-curves="' + name + '"]'); };
    return { metric: get("metric").value, arm: get("arm").value, limit: get("limit").value, highlight: get("highlight").value };
  };

  draw.curves = function (d, box) {
    // A name the study does not have is said in words (analysis.aliases maps a script's own names).
    if (!d.curves.length) return hpo.empty(box, d.missing ? d.missing.message : d.n_trials ? "No " + d.metric_name + " reported yet." : "No trials have run yet.");
    // Every curve in one trace, separated by gaps: one SVG path for 1,000 trials.
    var x = [], y = [], ids = [], text = [];
    d.curves.forEach(function (c) {
      for (var i = 0; i < c.steps.length; i++) {
        x.push(c.steps[i]); y.push(c.values[i]); ids.push(c.id); text.push(c.text + "<br>step " + c.steps[i] + ": " + hpo.fmt(c.values[i]));
      }
      x.push(null); y.push(null); ids.push(null); text.push("");
    });
    var ranked = d.curves.filter(function (c) { return c.rank !== null; });
    var copies = d.curves.length - ranked.length;
    var traces = [{ type: x.length > 20000 ? "scattergl" : "scatter", mode: "lines", x: x, y: y, customdata: ids, text: text, hovertemplate: HOVER,
      name: ranked.length + " trials" + (copies ? " and " + copies + " replicas" : ""), line: { color: "rgba(31,119,180,0.3)", width: 1 }, connectgaps: false }];
    var wanted = curveOptions().highlight.split(/[\s,]+/).filter(Boolean).map(Number);
    var chosen = d.curves.filter(function (c) { return wanted.indexOf(c.id) >= 0; });
    if (!chosen.length) chosen = ranked.slice(0, 3);  // the best three originals (replicas are never ranked)
    chosen.forEach(function (c, i) {
      traces.push({ type: "scatter", mode: "lines", x: c.steps, y: c.values, customdata: c.steps.map(function () { return c.id; }),
        text: c.steps.map(function (s, j) { return c.text + "<br>step " + s + ": " + hpo.fmt(c.values[j]); }), hovertemplate: HOVER,
        name: "trial " + c.id + (c.rank !== null ? " (#" + c.rank + ")" : " (replica of " + c.replica_of + ")"), line: { color: hpo.COLORS[(i + 1) % hpo.COLORS.length], width: 2.5 } });
    });
    var named = d.metric_name + (d.reported_as && d.reported_as !== d.metric_name ? " (" + d.reported_as + ")" : "");
    var yaxis = { title: { text: named + (d.log_y ? " (log)" : "") }, type: d.log_y ? "log" : "linear" };
    if (d.y_range) yaxis.range = d.y_range;
    return hpo.draw(box, traces, hpo.layout({ height: 460, xaxis: { title: { text: "step" } }, yaxis: yaxis }), "curves");
  };

  draw.grad_norm = function (d, box) {
    var entries = d.entries.filter(function (e) { return e.steps.length; });
    if (!entries.length) return hpo.empty(box, d.missing ? d.missing.message : d.entries.length ? "No train/grad_norm reported." : "No completed trials yet.");
    var traces = [], shapes = [];
    entries.forEach(function (e, i) {
      var color = hpo.COLORS[i % hpo.COLORS.length];
      traces.push({ type: "scatter", mode: "lines", x: e.steps, y: e.values, name: e.label + " (trial " + e.id + ")",
        customdata: e.steps.map(function () { return e.id; }), line: { color: color, width: 1 },
        hovertemplate: "trial " + e.id + "<br>step %{x}: %{y:.3g}<extra></extra>" });
      var hline = function (v, dash) { return { type: "line", xref: "paper", x0: 0, x1: 1, y0: v, y1: v, line: { color: color, dash: dash, width: 1.2 } }; };
      if (e.p90 !== null) shapes.push(hline(e.p90, "dash"));
      if (e.clip !== null && e.clip !== undefined) shapes.push(hline(e.clip, "dot"));
    });
    return hpo.draw(box, traces, hpo.layout({ shapes: shapes, xaxis: { title: { text: "step" } },
      yaxis: { title: { text: "gradient norm" + (d.reported_as && d.reported_as !== "train/grad_norm" ? ", " + d.reported_as : "") + " (log)" }, type: "log" } }), "grad_norm");
  };

  function url(kind) {
    var q = "";
    if (kind === "curves") {
      var o = curveOptions();
      q = "?metric=" + encodeURIComponent(o.metric) + "&limit=" + encodeURIComponent(o.limit || 300) + (o.arm ? "&arm=" + encodeURIComponent(o.arm) : "");
    } else if (kind === "contour") {
      var c = [];
      ["x", "y", "arm"].forEach(function (k) { if (contourChoice[k]) c.push(k + "=" + encodeURIComponent(contourChoice[k])); });
      q = c.length ? "?" + c.join("&") : "";
    } else if (kind === "importance") {
      var a = el("importance").parentElement.querySelector('[data-importance="arm"]');
      q = a && a.value ? "?arm=" + encodeURIComponent(a.value) : "";
    }
    return api + "/charts/" + kind + q;
  }

  function drawFrom(kind, box, data) {
    return data.then(function (d) { return draw[kind](d, box); }).catch(function (e) { hpo.failed(box, e); });
  }

  function load(kind) {
    var box = el(kind);
    if (!box) return Promise.resolve();
    return drawFrom(kind, box, hpo.getJSON(url(kind)));
  }

  // Charts draw when they come near the viewport, one at a time, so the page stays responsive
  // while a big study's charts draw; their data is asked for at once, and each draws in its turn
  // once its data has come, in the order the answers come: a chart whose answer came first no
  // longer waits for one asked before it (at 50,000 trials the first screen's four answers come
  // over 0.8 s, and drawing them all after the last one took another 0.8 s). A chart asked for
  // again before its last answer drew draws only the newer answer. A live redraw touches only
  // the charts already drawn.
  var queue = Promise.resolve();
  function enqueue(kind) {
    var box = el(kind);
    if (!box) return queue;
    var asked = (box._asked || 0) + 1;
    box._asked = asked;
    var data = hpo.getJSON(url(kind));
    return data.then(function () {}, function () { /* reported when its turn to draw comes */ }).then(function () {
      queue = queue.then(function () {
        return new Promise(function (resolve) { setTimeout(resolve, 0); });
      }).then(function () { return box._asked === asked ? drawFrom(kind, box, data) : undefined; });
      return queue;
    });
  }

  function loadAll() {
    return Promise.all(Object.keys(draw).filter(function (kind) {
      var box = el(kind);
      return box && box.dataset.rendered;
    }).map(enqueue));
  }

  var seen = new IntersectionObserver(function (entries) {
    entries.forEach(function (entry) {
      if (!entry.isIntersecting) return;
      var box = entry.target;
      seen.unobserve(box);
      box.dataset.requested = "1";
      enqueue(box.dataset.chart);
    });
    hpo.settled();
  }, { rootMargin: "200px" });

  var curveFig = el("curves") && el("curves").parentElement;
  if (curveFig) curveFig.querySelectorAll("[data-curves]").forEach(function (c) {
    c.addEventListener("change", function () { load("curves"); });
  });

  // --- trial table ---------------------------------------------------------------------------

  var table = { sort: "id", desc: false, offset: 0, limit: 50, filtered: 0 };
  var form = document.getElementById("trial-filters");

  // One filter per row of #param-filters (name, min or value, max); a categorical one sends
  // NAME=VALUE, a numeric one NAME:LO:HI. Brushing a parallel-coordinates axis fills them too.
  function paramFilters() {
    var out = [];
    form.querySelectorAll(".param-filter").forEach(function (row) {
      var sel = row.querySelector('select[name="param-name"]');
      var name = sel.value;
      var lo = row.querySelector('input[name="param-lo"]').value.trim(), hi = row.querySelector('input[name="param-hi"]').value.trim();
      if (!name || !(lo || hi)) return;
      var opt = sel.options[sel.selectedIndex];
      out.push(opt && opt.dataset.type === "categorical" ? name + "=" + lo : name + ":" + lo + ":" + hi);
    });
    return out;
  }

  function tableURL() {
    var q = ["sort=" + encodeURIComponent(table.sort), "desc=" + table.desc, "offset=" + table.offset, "limit=" + table.limit];
    form.querySelectorAll('input[name="status"]:checked').forEach(function (c) { q.push("status=" + c.value); });
    var arm = form.elements["arm"].value;
    if (arm) q.push("arm=" + encodeURIComponent(arm));
    paramFilters().forEach(function (f) { q.push("param=" + encodeURIComponent(f)); });
    return api + "/table?" + q.join("&");
  }

  function addFilterRow() {
    var rows = form.querySelectorAll(".param-filter");
    var row = rows[0].cloneNode(true);
    row.querySelectorAll("input").forEach(function (i) { i.value = ""; });
    row.querySelector("select").value = "";
    document.getElementById("param-filters").appendChild(row);
    return row;
  }

  function cell(tr, content, cls) {
    var td = document.createElement("td");
    if (cls) td.className = cls;
    if (content instanceof Node) td.appendChild(content); else td.textContent = content;
    tr.appendChild(td);
    return td;
  }

  function badge(text, cls, title) {
    var b = document.createElement("span"); b.className = "badge " + cls; b.textContent = text;
    if (title) b.title = title;
    return b;
  }

  function loadTable() {
    var summary = document.getElementById("table-summary");
    return hpo.getJSON(tableURL()).then(function (t) {
      table.filtered = t.filtered;
      var body = document.querySelector("#trial-table tbody");
      var labels = t.columns.map(function (c) { return c.label; });
      body.innerHTML = "";
      t.rows.forEach(function (r) {
        var tr = document.createElement("tr");
        tr.dataset.trialId = r.id;
        if (r.replica_of !== null) tr.classList.add("replica");
        var first = document.createElement("span");
        var a = document.createElement("a"); a.href = "/trials/" + r.id; a.textContent = "trial " + r.id; first.appendChild(a);
        if (r.replica_of !== null) first.appendChild(badge("replica of " + r.replica_of, "replica", "a replica: the same configuration with another seed; never ranked best"));
        if (r.retry_of !== null) first.appendChild(badge("retry of " + r.retry_of, "retry", "a new run of a failed trial"));
        if (r.resumed) first.appendChild(badge("resumed", "resumed", "its best value was reached in an attempt resumed from a checkpoint (the trial page says what that is worth)"));
        cell(tr, first);
        var st = document.createElement("span"); st.className = "status " + (r.diverged ? "infeasible" : r.status);
        st.textContent = r.diverged ? "diverged" : r.status; if (r.diverged) st.title = r.diverged; cell(tr, st);
        cell(tr, r.arm);
        cell(tr, hpo.fmt(r.objective), "num");
        labels.forEach(function (l) {
          var v = r.values[l];
          var td = cell(tr, v === null || v === undefined ? "" : hpo.fmt(v), "num param");
          if (v === null || v === undefined) td.title = "does not apply in this arm";
        });
        cell(tr, hpo.fmt(r.best_step), "num");
        cell(tr, hpo.duration(r.duration_seconds), "num");
        var why = cell(tr, r.reason ? r.reason.slice(0, 80) : "", "reason");
        if (r.reason) why.title = r.reason;
        cell(tr, (t.notes[String(r.id)] || "").slice(0, 80));
        body.appendChild(tr);
      });
      if (!t.rows.length) {
        var tr = document.createElement("tr");
        cell(tr, t.total ? "No trial matches the filters." : "No trials yet.");
        tr.firstChild.colSpan = 8 + labels.length;
        body.appendChild(tr);
      }
      var sorted = t.sort_metric ? " sorted by best " + t.sort_metric.name + " (" + t.sort_metric.mode + ")" : "";
      summary.textContent = t.filtered + " of " + t.total + " trials" + (t.filtered < t.total ? " match the filters" : "") + sorted;
      var last = Math.min(t.offset + t.limit, t.filtered);
      document.getElementById("table-page").textContent = t.filtered ? (t.offset + 1) + "–" + last + " of " + t.filtered : "";
      document.querySelectorAll("#trial-table th[data-sort]").forEach(function (th) {
        th.classList.toggle("sorted", th.dataset.sort === table.sort);
        th.classList.toggle("desc", th.dataset.sort === table.sort && table.desc);
      });
      document.body.dataset.tableRows = String(t.rows.length);
      document.body.dataset.tableFiltered = String(t.filtered);
    }).catch(function (e) { summary.textContent = "Could not load the trials: " + e.message; });
  }

  // Brushing a parallel-coordinates axis narrows the table to the same range (smart selection).
  hpo.filterTableByRange = function (label, lo, hi) {
    var rows = form.querySelectorAll(".param-filter"), row = null;
    rows.forEach(function (r) { var v = r.querySelector("select").value; if (v === label || (!row && !v)) row = row || r; });
    if (!row) row = addFilterRow();
    row.querySelector("select").value = label;
    row.querySelector('input[name="param-lo"]').value = lo === null ? "" : String(lo);
    row.querySelector('input[name="param-hi"]').value = hi === null ? "" : String(hi);
    table.offset = 0;
    loadTable();
  };

  if (form) {
    form.addEventListener("submit", function (ev) { ev.preventDefault(); table.offset = 0; loadTable(); });
    form.addEventListener("reset", function () {
      form.querySelectorAll(".param-filter").forEach(function (r, i) { if (i) r.remove(); });
      setTimeout(function () { table.offset = 0; loadTable(); }, 0);
    });
    form.querySelector("[data-add-filter]").addEventListener("click", addFilterRow);
    form.querySelectorAll('input[name="status"], select[name="arm"]').forEach(function (c) {
      c.addEventListener("change", function () { table.offset = 0; loadTable(); });
    });
    document.querySelectorAll("#trial-table th[data-sort]").forEach(function (th) {
      th.addEventListener("click", function () {
        if (table.sort === th.dataset.sort) table.desc = !table.desc; else { table.sort = th.dataset.sort; table.desc = false; }
        table.offset = 0;
        loadTable();
      });
    });
    document.querySelector('[data-page="prev"]').addEventListener("click", function () {
      table.offset = Math.max(0, table.offset - table.limit); loadTable();
    });
    document.querySelector('[data-page="next"]').addEventListener("click", function () {
      if (table.offset + table.limit < table.filtered) { table.offset += table.limit; loadTable(); }
    });
  }

  // --- live progress -------------------------------------------------------------------------

  var version = null;
  var lastRedraw = 0;

  function showProgress(p) {
    Object.keys(p.counts).forEach(function (k) {
      var span = root.querySelector('[data-count="' + k + '"]');
      if (span) span.textContent = p.counts[k];
    });
    var bar = root.querySelector("#progress-live .progress");
    if (bar && p.total) {
      bar.innerHTML = "";
      ["completed", "infeasible", "failed", "cancelled", "running"].forEach(function (s) {
        if (!p.counts[s]) return;
        var seg = document.createElement("span");
        seg.className = "seg " + s;
        seg.style.width = (100 * p.counts[s] / p.total) + "%";
        bar.appendChild(seg);
      });
      var label = bar.nextElementSibling;
      if (label) label.textContent = p.finished + "/" + p.total + " finished";
    }
    var eta = document.getElementById("progress-eta");
    var left = p.counts.pending + p.counts.running;
    if (!left) eta.textContent = "All trials finished.";
    else if (p.eta_seconds !== null) eta.textContent = left + " trials left · about " + hpo.fmt(p.rate_per_hour) + " finish per hour · ETA " + hpo.duration(p.eta_seconds);
    else eta.textContent = left + " trials left · ETA unknown until two trials finish within an hour";
    var stall = document.getElementById("progress-stall");
    stall.hidden = !p.stalled;
    if (p.stalled) stall.textContent = p.idle_seconds === null
      ? "Nothing has started yet: is a worker running? (hpo worker --server …)"
      : "Nothing has started or finished for " + hpo.duration(p.idle_seconds) + ": are the workers still running?";
    var running = document.getElementById("progress-running");
    running.textContent = p.running.length ? "Running: " : "";
    p.running.slice(0, 20).forEach(function (r, i) {
      var a = document.createElement("a"); a.href = "/trials/" + r.id; a.textContent = "trial " + r.id;
      if (i) running.appendChild(document.createTextNode(", "));
      running.appendChild(a);
    });
    if (p.running.length > 20) running.appendChild(document.createTextNode(" and " + (p.running.length - 20) + " more"));
    var status = document.getElementById("study-status");
    status.textContent = p.status;
    status.className = "status " + p.status;
  }

  // The bayesian section (in the analysis sections, data inlined as JSON): the running best
  // against trial number, and the model's predicted mean ± std along each dimension.
  function bayesBand(sl, color) {
    var up = sl.mean.map(function (m, i) { return m + sl.std[i]; });
    var lo = sl.mean.map(function (m, i) { return m - sl.std[i]; });
    var text = sl.x.map(function (x, i) {
      var f = sl.feasible ? "<br>P(feasible) = " + hpo.fmt(sl.feasible[i]) : "";
      return sl.name + " = " + hpo.fmt(x) + "<br>mean " + hpo.fmt(sl.mean[i]) + " ± " + hpo.fmt(sl.std[i]) + f;
    });
    return [
      { type: "scatter", mode: "lines", x: sl.x, y: up, line: { width: 0 }, hoverinfo: "skip", showlegend: false },
      { type: "scatter", mode: "lines", x: sl.x, y: lo, line: { width: 0 }, fill: "tonexty", fillcolor: "rgba(31,119,180,0.2)",
        hoverinfo: "skip", name: "± std" },
      { type: "scatter", mode: "lines", x: sl.x, y: sl.mean, line: { color: color, width: 2 }, text: text, hovertemplate: HOVER, name: "mean" },
    ];
  }

  function drawBayesian() {
    var data = document.getElementById("bayesian-data");
    if (!data || !window.Plotly) return;
    var bo;
    try { bo = JSON.parse(data.textContent); } catch (e) { return; }
    var best = root.querySelector('[data-bayes="best"]');
    if (best && bo.best_so_far.length) {
      var pts = bo.best_so_far.filter(function (p) { return p.value !== null; });
      var label = function (p) { return "trial " + p.trial_id + " (no. " + p.number + ", " + p.source + ")"; };
      var traces = [
        { type: "scatter", mode: "markers", name: "trial value", x: pts.map(function (p) { return p.number; }),
          y: pts.map(function (p) { return p.value; }), customdata: pts.map(function (p) { return p.trial_id; }),
          text: pts.map(function (p) { return label(p) + "<br>" + metric + " = " + hpo.fmt(p.value); }), hovertemplate: HOVER,
          marker: { size: 7, opacity: 0.85, color: pts.map(function (p) { return p.source === "initial" ? "#999" : hpo.COLORS[0]; }) } },
        { type: "scatter", mode: "lines+markers", name: "best so far", x: bo.best_so_far.map(function (p) { return p.number; }),
          y: bo.best_so_far.map(function (p) { return p.best; }), customdata: bo.best_so_far.map(function (p) { return p.trial_id; }),
          text: bo.best_so_far.map(function (p) { return label(p) + "<br>best so far " + hpo.fmt(p.best) + (p.value === null ? "<br>infeasible" : ""); }),
          hovertemplate: HOVER, line: { shape: "hv", color: "#333", width: 1.5 }, marker: { size: 3, color: "#333" } },
      ];
      hpo.draw(best, traces, hpo.layout({ xaxis: { title: { text: "trial number" } }, yaxis: { title: { text: metric } } }), "bayesian-best");
    }
    var model = root.querySelector('[data-bayes="model"]');
    if (model && bo.model && bo.model.slices.length) {
      model.innerHTML = "";
      bo.model.slices.forEach(function (sl) {
        var div = document.createElement("div");
        div.className = "plot panel";
        div.dataset.slice = sl.name;
        model.appendChild(div);
        var at = bo.model.best_params ? bo.model.best_params[sl.name] : null;
        var shapes = typeof at === "number" ? [{ type: "line", xref: "x", yref: "paper", x0: at, x1: at, y0: 0, y1: 1,
          line: { dash: "dash", color: "#999", width: 1 } }] : [];
        hpo.plot(div, bayesBand(sl, hpo.COLORS[0]), hpo.layout({ height: 300, shapes: shapes, showlegend: false,
          margin: { l: 64, r: 12, t: 12, b: 48 }, xaxis: { title: { text: sl.name }, type: sl.scale === "log" ? "log" : "linear" },
          yaxis: { title: { text: "predicted " + metric } } }), hpo.config("bayesian-" + sl.name));
      });
      model.dataset.rendered = "1";
    }
  }

  // The analysis' sections: in the page when the server had them, fetched otherwise, and
  // refreshed when a trial starts or finishes.
  var sections = document.getElementById("analysis-sections");
  function loadSections() {
    return fetch(sections.dataset.src, { headers: { Accept: "text/html" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(new Error("HTTP " + r.status)); })
      .then(function (html) { sections.innerHTML = html; sections.dataset.loaded = "1"; drawBayesian(); })
      .catch(function (e) { sections.dataset.loaded = "0"; sections.querySelectorAll("p.empty").forEach(function (p) { p.textContent = "Could not run the checklist: " + e.message; }); });
  }
  // On a first visit the checklist is asked for once the charts in view have drawn: computed at
  // the same time, it shared the server's cores with them (docs/decisions.md).
  // (at the latest after 10 s: a tab opened in the background draws nothing until shown).
  function afterCharts(fn) {
    if (document.body.dataset.chartsReadyAt) return fn();
    var done = false;
    var once = function () {
      if (done) return;
      done = true;
      document.removeEventListener("hpo:charts-ready", once);
      fn();
    };
    document.addEventListener("hpo:charts-ready", once);
    setTimeout(once, 10000);
  }
  if (sections && sections.dataset.pending) afterCharts(loadSections);
  else if (sections) { sections.dataset.loaded = "1"; drawBayesian(); }

  function poll() {
    return hpo.getJSON(api + "/charts/progress").then(function (p) {
      showProgress(p);
      var left = p.counts.pending + p.counts.running;
      if (version !== null && p.version !== version && (Date.now() - lastRedraw > 5000 || !left)) {
        lastRedraw = Date.now();
        loadAll();
        loadTable();
        if (sections) loadSections();
      }
      version = p.version;
      root.dataset.live = p.counts.pending + p.counts.running > 0 && p.status === "active" ? "1" : "0";
    }).catch(function () { /* the next poll tries again */ });
  }

  function tick() {
    if (!document.hidden) poll();
    if (root.dataset.live === "1") setTimeout(tick, 3000);
  }

  Object.keys(draw).forEach(function (kind) {
    var box = el(kind);
    if (!box) return;
    if (box.dataset.onDemand) {  // drawn on request: a chart whose WebGL start-up may freeze a GPU-less page
      box.querySelector("[data-draw]").addEventListener("click", function () { box.dataset.requested = "1"; enqueue(kind); });
    } else {
      seen.observe(box);
    }
  });
  // The trial table is below every chart: on a first visit it is asked for once the charts in
  // view have drawn, as the checklist is (at 50,000 trials its first page took 1.2 s of the
  // server's interpreter while the first charts were being computed).
  afterCharts(loadTable);
  // The first poll (the ETA and the running trials; the counts come with the page) waits for the
  // charts in view too: at 50,000 trials it was 0.2 s of the server's interpreter beside them.
  afterCharts(function () {
    poll().then(function () { if (root.dataset.live === "1") setTimeout(tick, 3000); });
  });
  // A control on the page changed the study (actions.js): show it at once, and keep polling
  // while the new trials run.
  document.addEventListener("hpo:changed", function () {
    loadTable();
    poll().then(function () { if (root.dataset.live === "1") setTimeout(tick, 3000); });
  });
})();
