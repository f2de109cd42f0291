// Marks whether every plot image rendered: <body data-plots-loaded="N" data-plots-total="M">.
// The browser test reads these attributes; a person sees a red outline on a plot that failed.
(function () {
  function count() {
    var plots = document.querySelectorAll("img.plot");
    var loaded = 0;
    plots.forEach(function (img) {
      if (img.complete && img.naturalWidth > 0) { loaded += 1; img.classList.remove("broken"); }
      else if (img.complete) { img.classList.add("broken"); }
    });
    document.body.dataset.plotsLoaded = String(loaded);
    document.body.dataset.plotsTotal = String(plots.length);
  }
  document.querySelectorAll("img.plot").forEach(function (img) {
    img.addEventListener("load", count);
    img.addEventListener("error", count);
  });
  window.addEventListener("load", count);
  count();
})();
