// Shared helpers of the dashboard's pages: JSON fetching, Plotly defaults, click-to-trial, empty
// states, notes. Each chart container records what it drew (data-rendered, data-points) so a
// person sees an honest empty state and the browser tests can count points.
(function () {
  "use strict";
  var hpo = (window.hpo = {});
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"];
  hpo.COLORS = COLORS;
  hpo.INFEASIBLE = "#d62728";

  hpo.getJSON = function (url) {
    return fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" }).then(function (r) {
      return r.json().then(function (body) {
        if (!r.ok) {
          var e = new Error((body && (body.message || body.detail)) || "HTTP " + r.status);
          e.status = r.status;
          throw e;
        }
        return body;
      });
    });
  };

  hpo.config = function (name) {
    return {
      displaylogo: false,
      responsive: true,
      modeBarButtonsToRemove: ["lasso2d", "select2d"],
      toImageButtonOptions: { format: "png", scale: 2, filename: name || "hpo-chart" },
    };
  };

  hpo.layout = function (extra) {
    var base = {
      margin: { l: 64, r: 16, t: 28, b: 48 },
      font: { size: 12, family: "system-ui, sans-serif" },
      hovermode: "closest",
      hoverlabel: { align: "left" },
      showlegend: true,
      legend: { orientation: "h", y: -0.22, font: { size: 11 } },
      height: 360,
      paper_bgcolor: "#fff",
      plot_bgcolor: "#fff",
    };
    return Object.assign(base, extra || {});
  };

  // Plotly comes in two bundles. The study page starts with plotly.js's cartesian bundle (1.5 MB:
  // scatter, bar, box, histogram, contour), which parses in a third of the time of the full one
  // (4.8 MB); a chart that needs WebGL (scattergl, parcoords) loads the full bundle on first use,
  // and a chart drawn by the other bundle is purged before it is drawn again. Pages that load the
  // full bundle from the start (trial, compare) mark it data-plotly="full" and never switch.
  var NEEDS_FULL = { scattergl: true, parcoords: true };
  var fullPlotly = null;
  function plotlyFor(traces) {
    var full = traces.some(function (t) { return NEEDS_FULL[t.type]; });
    if (!full || document.querySelector('script[data-plotly="full"][data-loaded]')) return Promise.resolve(window.Plotly);
    if (!fullPlotly) {
      fullPlotly = new Promise(function (resolve, reject) {
        var s = document.createElement("script");
        s.src = "/static/vendor/plotly.min.js";
        s.dataset.plotly = "full";
        s.onload = function () { s.dataset.loaded = "1"; resolve(window.Plotly); };
        s.onerror = function () { fullPlotly = null; reject(new Error("could not load Plotly's full bundle")); };
        document.head.appendChild(s);
      });
    }
    return fullPlotly;
  }

  // Plotly draws `<a href=...>` in any text it is given (hover, legend, ticks, titles) as a link,
  // and `<span style=...>` as styled text. Chart text comes from specs and from trial code (a
  // metric's name is any text a trial posts), and pages join it with their own, so before every
  // draw each `<` that opens a tag, but the pages' own `<br>` and `<extra>`, becomes "‹", which
  // Plotly shows as text (the server does the same to its chart answers; docs/security.md, "The
  // dashboard"). In place: strings are replaced only where they hold markup.
  var MARKUP = /<(?=\/?[A-Za-z])(?!br>|\/?extra>)/g;
  function plainText(value, depth) {
    if (typeof value === "string") return value.indexOf("<") < 0 ? value : value.replace(MARKUP, "\u2039");
    if (!value || typeof value !== "object" || depth > 10 || ArrayBuffer.isView(value)) return value;
    var keys = Array.isArray(value) ? null : Object.keys(value);
    var n = keys ? keys.length : value.length;
    for (var i = 0; i < n; i++) {
      var k = keys ? keys[i] : i, v = value[k];
      if (v && (typeof v === "string" || typeof v === "object")) {
        var plain = plainText(v, depth + 1);
        if (plain !== v) value[k] = plain;
      }
    }
    return value;
  }
  hpo.plainText = plainText;

  // Plotly.react through the bundle the traces need; answers the Plotly that drew.
  hpo.plot = function (el, traces, layout, config) {
    plainText(traces, 0);
    plainText(layout, 0);
    return plotlyFor(traces).then(function (P) {
      if (el._hpoPlotly && el._hpoPlotly !== P) {
        el._hpoPlotly.purge(el);
        delete el.dataset.listening;
      }
      el._hpoPlotly = P;
      return P.react(el, traces, layout, config).then(function () { return P; });
    });
  };

  // Draws (or redraws) a chart and records its point count; clicks open the trial in customdata.
  hpo.draw = function (el, traces, layout, name) {
    el.classList.remove("empty");
    Array.prototype.forEach.call(el.querySelectorAll(":scope > p.empty"), function (p) { p.remove(); });
    var points = 0;
    traces.forEach(function (t) {
      if (t.x && t.type !== "contour" && t.type !== "heatmap") points += t.x.filter(function (v) { return v !== null; }).length;
      if (t.type === "parcoords" && t.dimensions && t.dimensions.length) points += t.dimensions[0].values.length;
    });
    var t0 = performance.now();
    return hpo.plot(el, traces, layout, hpo.config(name)).then(function () {
      el.dataset.drawMs = String(Math.round(performance.now() - t0));
      if (!el.dataset.listening) {
        el.dataset.listening = "1";
        el.on("plotly_click", function (ev) {
          var p = ev && ev.points && ev.points[0];
          var id = p && (Array.isArray(p.customdata) ? p.customdata[0] : p.customdata);
          if (id) window.location.href = "/trials/" + id;
        });
      }
      el.dataset.rendered = "1";
      el.dataset.points = String(points);
      el.dataset.empty = "0";
      hpo.settled(el);
    });
  };

  hpo.empty = function (el, text) {
    if (el.dataset.rendered && (el._hpoPlotly || window.Plotly)) (el._hpoPlotly || window.Plotly).purge(el);
    delete el.dataset.listening;
    delete el._hpoPlotly;
    el.innerHTML = "";
    var p = document.createElement("p");
    p.className = "empty";
    p.textContent = text;
    el.appendChild(p);
    el.dataset.rendered = "1";
    el.dataset.points = "0";
    el.dataset.empty = "1";
    hpo.settled(el);
  };

  hpo.failed = function (el, err) {
    hpo.empty(el, "Could not load this chart: " + (err && err.message ? err.message : err));
    el.dataset.failed = "1";
  };

  // Counts settled charts on <body data-charts-settled="N">, for tests and for the timing bench.
  // Charts draw when scrolled near (data-requested); "ready" once every requested one has drawn.
  // Called after each draw and after the page's first look at which charts are in view.
  hpo.settled = function () {
    var all = document.querySelectorAll("[data-chart]");
    var done = 0, requested = 0;
    all.forEach(function (c) {
      if (c.dataset.onDemand && !c.dataset.requested) return;
      if (c.dataset.rendered) done += 1;
      if (c.dataset.requested || c.dataset.rendered) requested += 1;
    });
    document.body.dataset.chartsSettled = String(done);
    document.body.dataset.chartsTotal = String(Array.prototype.filter.call(all, function (c) { return !c.dataset.onDemand || c.dataset.requested; }).length);
    // Nothing requested yet is ready too once the viewport has been looked at (the observer's
    // first report): a page scrolled past its charts, or one whose charts are all further down.
    if (done === requested && !document.body.dataset.chartsReadyAt) {
      document.body.dataset.chartsReadyAt = String(Math.round(performance.now()));
      document.dispatchEvent(new Event("hpo:charts-ready"));
    }
  };

  hpo.fmt = function (v) {
    if (v === null || v === undefined || (typeof v === "number" && !isFinite(v))) return "–";
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v)) return String(v);
    return Number(v.toPrecision(4)).toString();
  };

  hpo.duration = function (s) {
    if (s === null || s === undefined) return "–";
    s = Math.round(s);
    if (s < 90) return s + " s";
    if (s < 5400) return Math.round(s / 60) + " min";
    if (s < 172800) return (s / 3600).toFixed(1) + " h";
    return (s / 86400).toFixed(1) + " d";
  };

  // "author · 2026-11-25 05:43 UTC", as the page writes it (the author: the saving token's name).
  function noteSaved(note) {
    var at = note.updated_at.slice(0, 16).replace("T", " ") + " UTC";
    return note.author ? note.author + " · " + at : "saved " + at;
  }

  // Notes: Markdown in a textarea, saved with PUT (a write role is needed once tokens exist); the
  // server renders it (raw HTML escaped), so the view shows the server's HTML as it is.
  function setupNote() {
    var box = document.getElementById("note");
    if (!box) return;
    var button = box.querySelector(".save-note");
    var status = box.querySelector(".note-status");
    var view = box.querySelector(".note-view");
    var preview = box.querySelector(".preview-note");
    var saved = box.querySelector(".note-saved");
    if (preview) preview.addEventListener("click", function () {
      fetch("/api/v1/notes/preview", { method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ body: box.querySelector("textarea").value }) })
        .then(function (r) { return r.json().then(function (b) {
          if (!r.ok) { status.textContent = "no preview: " + (b.message || b.detail || r.status); return; }
          view.innerHTML = b.html; status.textContent = "preview (not saved)";
        }); }).catch(function (e) { status.textContent = "no preview: " + e; });
    });
    button.addEventListener("click", function () {
      status.textContent = "saving…";
      fetch(box.dataset.url, {
        method: "PUT",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ body: box.querySelector("textarea").value }),
      }).then(function (r) {
        return r.json().then(function (b) {
          status.textContent = r.ok ? "saved" : "not saved: " + (b.message || b.detail || r.status);
          if (r.ok && view) view.innerHTML = b.html || '<p class="muted">No notes yet.</p>';
          if (r.ok && saved && b.updated_at) saved.textContent = noteSaved(b);
        });
      }).catch(function (e) { status.textContent = "not saved: " + e; });
    });
  }
  document.addEventListener("DOMContentLoaded", setupNote);
})();
