// The page's controls (study, arm table, warnings, trial page): each is a <form class="action">
// with data-method and data-url; its named inputs are the JSON body (numbers as numbers). The
// answer shows beside the button without a reload; csrf.js adds the CSRF header to the write.
// Forms inside the analysis sections are inserted later, so submits are caught on the document.
(function () {
  "use strict";

  function body(form) {
    var out = {};
    Array.prototype.forEach.call(form.elements, function (input) {
      if (!input.name) return;
      out[input.name] = input.type === "number" ? Number(input.value) : input.value;
    });
    return out;
  }

  function describe(form, answer) {
    var ids = answer.trial_ids || (Array.isArray(answer) ? answer : null);
    if (ids) return ids.length ? "created trial" + (ids.length > 1 ? "s " : " ") + ids.join(", ") : "nothing to do";
    if (answer.status) return (form.dataset.done || "done") + " (status " + answer.status + (answer.num_trials ? ", " + answer.num_trials + " trials per arm" : "") + ")";
    return form.dataset.done || "done";
  }

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!form.classList || !form.classList.contains("action")) return;
    ev.preventDefault();
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
    var result = form.querySelector(".action-result");
    var button = form.querySelector("button[type=submit]");
    button.disabled = true;
    result.className = "action-result muted small";
    result.textContent = "…";
    var payload = body(form);
    fetch(form.dataset.url, {
      method: form.dataset.method || "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: Object.keys(payload).length || form.dataset.method !== "POST" ? JSON.stringify(payload) : "{}",
    }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (answer) {
        if (!r.ok) throw new Error(answer.message || (answer.detail && JSON.stringify(answer.detail)) || "HTTP " + r.status);
        result.className = "action-result ok small";
        result.textContent = describe(form, answer);
        form.dataset.answered = "1";
        document.dispatchEvent(new CustomEvent("hpo:changed", { detail: { url: form.dataset.url, answer: answer } }));
      });
    }).catch(function (e) {
      result.className = "action-result error small";
      result.textContent = "failed: " + e.message;
      form.dataset.answered = "0";
    }).then(function () { button.disabled = false; });
  });
})();
