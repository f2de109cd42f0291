"""Dashboard sign-in: a browser cannot send `Authorization`, so a person signs in once with a
token and gets a session cookie (a random id, HttpOnly, SameSite=Strict, 12 hours) that names a
session kept in the database; sign-out deletes it. Writes from a signed-in page echo a CSRF token
derived from the session (`hpo_csrf` cookie, readable by the page's script, sent back as the
`X-HPO-CSRF` header or the `csrf` form field)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.requests import cookie_parser

from hpo.server.api.guards.credentials import CSRF_COOKIE, SESSION_COOKIE
from hpo.server.api.routes.dashboard import _ENV
from hpo.server.auth.tokens import SESSION_SECONDS, Authenticator, Principal, hash_token

router = APIRouter(include_in_schema=False)
_MAX_FORM = 8192


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request, next: str = "/") -> HTMLResponse:
    auth: Authenticator = request.app.state.auth
    principal = _signed_in(request)
    return _render(
        request,
        needed=auth.enabled(),
        role=principal.role if principal else None,
        csrf=auth.csrf_token(principal.session) if principal and principal.session else "",
        next=_safe_next(next),
    )


@router.post("/signin", response_class=HTMLResponse)
async def signin(request: Request) -> Response:
    form = await _form(request)
    auth: Authenticator = request.app.state.auth
    token, target = form.get("token", "").strip(), _safe_next(form.get("next", "/"))
    if not _same_origin(request):
        return _render(request, status=403, needed=True, error="sign-in from another site refused", next=target)
    principal = await run_in_threadpool(auth.principal, token) if token else None
    if principal is None or principal.role == "trial":
        return _render(request, status=401, needed=True, error="unknown or revoked token", next=target)
    cookie = await run_in_threadpool(auth.start_session, hash_token(token))
    response = RedirectResponse(target, status_code=303)
    secure = request.url.scheme == "https"
    common: dict[str, Any] = {"max_age": SESSION_SECONDS, "samesite": "strict", "secure": secure, "path": "/"}
    response.set_cookie(SESSION_COOKIE, cookie, httponly=True, **common)
    response.set_cookie(CSRF_COOKIE, auth.csrf_token(hash_token(cookie)), httponly=False, **common)
    return response


@router.post("/signout")
async def signout(request: Request) -> Response:
    """Ends the session on the server (every server sharing the database refuses its cookie from
    now on), then clears the cookies."""
    form = await _form(request)
    auth: Authenticator = request.app.state.auth
    principal = await run_in_threadpool(_signed_in, request)
    if principal is not None and principal.session is not None:
        if form.get("csrf", "") != auth.csrf_token(principal.session):
            return _render(request, status=403, needed=True, error="sign-out needs the page's CSRF token", next="/")
        await run_in_threadpool(auth.end_session, _cookie(request))
    response = RedirectResponse("/signin", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(CSRF_COOKIE, path="/")
    return response


def _cookie(request: Request) -> str:
    return cookie_parser(request.headers.get("cookie", "")).get(SESSION_COOKIE, "")


def _signed_in(request: Request) -> Principal | None:
    """The session's principal, if the request carries a live session (blocking)."""
    cookie = _cookie(request)
    auth: Authenticator = request.app.state.auth
    return auth.session_principal(cookie) if cookie else None


async def _form(request: Request) -> dict[str, str]:
    body = await request.body()
    if len(body) > _MAX_FORM:
        return {}
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=10)
    return {k: v[0] for k, v in parsed.items()}


def _safe_next(target: str) -> str:
    """Only a path on this server: never `//evil.example` or `https://...` (an open redirect)."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


def _render(request: Request, status: int = 200, **context: Any) -> HTMLResponse:
    context.setdefault("error", None)
    context.setdefault("role", None)
    context.setdefault("csrf", "")
    html = _ENV.get_template("signin.html").render(refresh=None, **context)
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})
