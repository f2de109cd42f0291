// Signed-in pages send the session's CSRF token with their own writes (docs/security.md): every
// same-origin fetch that is not a GET carries the `hpo_csrf` cookie's value as X-HPO-CSRF, so page
// scripts need not know about it. Cross-site pages cannot read the cookie, so cannot forge it.
(function () {
  "use strict";
  const original = window.fetch;
  const csrf = () => {
    const match = document.cookie.match(/(?:^|;\s*)hpo_csrf=([^;]*)/);
    return match ? decodeURIComponent(match[1]) : null;
  };
  window.fetch = function (input, init) {
    const request = input instanceof Request ? input : null;
    const method = ((init && init.method) || (request ? request.method : "GET")).toUpperCase();
    const url = new URL(request ? request.url : String(input), window.location.href);
    const token = csrf();
    if (token && url.origin === window.location.origin && !["GET", "HEAD", "OPTIONS"].includes(method)) {
      const headers = new Headers((init && init.headers) || (request ? request.headers : undefined));
      headers.set("X-HPO-CSRF", token);
      init = Object.assign({}, init, { headers: headers });
    }
    return original.call(this, input, init);
  };
})();
