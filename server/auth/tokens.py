"""Who may call what: API tokens with roles, the trial tokens a worker hands its trial processes,
and the dashboard sessions. Plain Python over the `Database`; the HTTP side
(`hpo.server.api.guards.credentials`) only maps a request to a permission and asks here.

Roles (docs/security.md):
- `read`: every GET (studies, trials, metrics, analysis, plots, the dashboard, /metrics).
- `write`: read, plus creating and changing studies, manual trials, replicas, cancel.
- `worker`: claim, and the lease-fenced trial writes (heartbeat, metrics, checkpoints, complete,
  fail). Nothing else: a stolen worker token cannot create a study (that is, run code) or read.
- `admin`: everything. `HPO_API_TOKEN`, when set on the server, is an admin token.

Tokens are 256-bit random strings; only their SHA-256 is stored, compared in constant time. A
preimage search on SHA-256 of a 256-bit secret is out of reach, so a slow password hash would only
slow every request down.

A trial token (`hpot.<trial>.<lease>.<mac>`) is what a trial process carries instead of the worker's
token: it may post metrics and checkpoints for that one trial, under its own lease only (the routes
compare the body's `lease_id` with the token's), and only while that lease is current and the trial
runs (the writes are lease-fenced), so it stops working when its attempt ends, and code running
inside a trial can do nothing it could not do by writing its own metrics file.

A dashboard session is a row keyed by the SHA-256 of a random id that the cookie carries: sign-out
deletes it, revoking the token ends it, and every server process sharing the database sees either
at once. The signing key (trial tokens, CSRF tokens) lives outside the database
(`hpo.server.auth.signing_key`)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import delete, func, select

from hpo.server.db import Database
from hpo.server.errors import InvalidInput, NotFound
from hpo.server.models import ApiToken, DashboardSession

Role = Literal["read", "write", "worker", "admin"]
Permission = Literal["read", "write", "worker"]
ROLES: tuple[str, ...] = ("read", "write", "worker", "admin")
# Which roles hold each permission; admin holds every one (and the token commands).
GRANTS: dict[str, frozenset[str]] = {
    "read": frozenset({"read", "write", "admin"}),
    "write": frozenset({"write", "admin"}),
    "worker": frozenset({"worker", "admin"}),
}
TOKEN_PREFIX = "hpo_"
TRIAL_TOKEN_PREFIX = "hpot."
SESSION_SECONDS = 12 * 3600
_TRIAL_TOKEN = re.compile(r"hpot\.([0-9]{1,10})\.([A-Za-z0-9_-]{1,100})\.([A-Za-z0-9_-]{1,100})")


def new_token() -> str:
    """A fresh API token: 256 random bits, URL-safe, recognisable by its prefix in logs and scanners."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class TokenInfo:
    id: int
    name: str
    role: str
    created_at: datetime
    revoked_at: datetime | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class Principal:
    """Who is calling: a role, and for a trial token the one trial it may write."""

    role: str
    token_id: int | None = None
    trial_id: int | None = None
    token_hash: str | None = None
    # A trial token's lease (its writes must name it); a session's id hash (its CSRF token's seed).
    lease_id: str | None = None
    session: str | None = None

    def may(self, permission: str) -> bool:
        return self.role in GRANTS.get(permission, frozenset())


# --- token records (the `hpo token` commands) ----------------------------------------------------


def create_token(db: Database, role: str, name: str = "") -> tuple[TokenInfo, str]:
    """Stores a new token's hash; answers its record and the token itself (shown once, never stored)."""
    if role not in ROLES:
        raise InvalidInput.one("role", f"must be one of {', '.join(ROLES)}, not {role!r}")
    if len(name) > 200 or any(ord(c) < 32 for c in name):
        raise InvalidInput.one("name", "must be at most 200 printable characters")
    token = new_token()
    with db.transaction() as session:
        row = ApiToken(name=name, role=role, token_hash=hash_token(token))
        session.add(row)
        session.flush()
        session.refresh(row)
        return _info(row), token


def list_tokens(db: Database) -> list[TokenInfo]:
    with db.transaction() as session:
        return [_info(row) for row in session.scalars(select(ApiToken).order_by(ApiToken.id))]


def revoke_token(db: Database, token_id: int) -> TokenInfo:
    """Revokes a token (kept, for the record) and ends its dashboard sessions. Servers stop
    accepting it within `CACHE_SECONDS`."""
    with db.transaction() as session:
        row = session.get(ApiToken, token_id)
        if row is None:
            raise NotFound(f"token {token_id} not found")
        if row.revoked_at is None:
            row.revoked_at = datetime.now().astimezone()
        session.execute(delete(DashboardSession).where(DashboardSession.token_hash == row.token_hash))
        session.flush()
        return _info(row)


def token_count(db: Database) -> int:
    """How many tokens were ever created. Revoked ones count: revoking the last token must lock
    the server, not open it again."""
    with db.transaction() as session:
        return int(session.scalar(select(func.count()).select_from(ApiToken)) or 0)


# The name a note says it was written with when the caller used HPO_API_TOKEN (it has no record).
ENV_TOKEN_NAME = "HPO_API_TOKEN"


def author_name(db: Database, principal: Principal | None) -> str | None:
    """The name a principal's writes are signed with (a note's author): its token's name, the
    token's number when it was created without one, `HPO_API_TOKEN` for that token; None when
    the server needs no token (no principal) or for a trial token."""
    if principal is None or principal.role == "trial":
        return None
    if principal.token_id is None:
        return ENV_TOKEN_NAME
    with db.transaction() as session:
        name = session.scalar(select(ApiToken.name).where(ApiToken.id == principal.token_id))
    return name or f"token {principal.token_id}"


def _role_of_hash(db: Database, token_hash: str) -> tuple[int, str] | None:
    with db.transaction() as session:
        row = session.execute(
            select(ApiToken.id, ApiToken.role, ApiToken.token_hash).where(
                ApiToken.token_hash == token_hash, ApiToken.revoked_at.is_(None)
            )
        ).first()
    if row is None or not hmac.compare_digest(row.token_hash, token_hash):
        return None
    return int(row.id), str(row.role)


def _info(row: ApiToken) -> TokenInfo:
    return TokenInfo(id=row.id, name=row.name, role=row.role, created_at=row.created_at, revoked_at=row.revoked_at)


# --- checking a request's credentials ------------------------------------------------------------

CACHE_SECONDS = 2.0
_CACHE_LIMIT = 10_000


class Authenticator:
    """Answers who a bearer token or session cookie belongs to. Lookups are cached for
    `CACHE_SECONDS`, so a busy worker's metrics posts do not each cost a query; a new or revoked
    token takes effect within that time."""

    def __init__(self, db: Database, admin_token: str | None, key: bytes) -> None:
        self._db = db
        self._admin_hash = hash_token(admin_token) if admin_token else None
        self._key = key
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        self._enabled_until = 0.0
        self._enabled = bool(admin_token)

    def enabled(self) -> bool:
        """Whether calls need credentials: `HPO_API_TOKEN` is set or a token was ever created (blocking)."""
        if self._admin_hash is not None:
            return True
        now = time.monotonic()
        if now >= self._enabled_until:
            self._enabled = token_count(self._db) > 0
            self._enabled_until = now + CACHE_SECONDS
        return self._enabled

    def enabled_is_cached(self) -> bool:
        return self._admin_hash is not None or time.monotonic() < self._enabled_until

    def cached(self, token: str) -> tuple[bool, Principal | None]:
        """(hit, principal) from the cache alone, so the async caller can skip a thread hop."""
        if token.startswith(TRIAL_TOKEN_PREFIX):
            return True, self._trial_principal(token)
        entry = self._cache.get(hash_token(token))
        if entry is None or entry[0] < time.monotonic():
            return False, None
        return True, entry[1]

    def principal(self, token: str) -> Principal | None:
        """Who `token` is (blocking: may query the database); None for an unknown or revoked one."""
        if token.startswith(TRIAL_TOKEN_PREFIX):
            return self._trial_principal(token)
        return self._by_hash(hash_token(token))

    def _by_hash(self, token_hash: str) -> Principal | None:
        entry = self._cache.get(token_hash)
        if entry is not None and entry[0] >= time.monotonic():
            return entry[1]
        if self._admin_hash is not None and hmac.compare_digest(token_hash, self._admin_hash):
            found: Principal | None = Principal("admin", token_id=None, token_hash=token_hash)
        else:
            row = _role_of_hash(self._db, token_hash)
            found = None if row is None else Principal(row[1], token_id=row[0], token_hash=token_hash)
        with self._lock:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[token_hash] = (time.monotonic() + CACHE_SECONDS, found)
        return found

    # -- trial tokens -------------------------------------------------------------------------

    def trial_token(self, trial_id: int, lease_id: str) -> str:
        return f"{TRIAL_TOKEN_PREFIX}{trial_id}.{lease_id}.{self._mac(f'trial:{trial_id}:{lease_id}')}"

    def _trial_principal(self, token: str) -> Principal | None:
        # A header is decoded as latin-1, so any byte may be here: `"²".isdigit()` is true but
        # `int("²")` fails, and `compare_digest` refuses non-ASCII text. Anything but the shape
        # `hpot.<digits>.<lease>.<mac>` in printable ASCII is simply not a token (401).
        match = _TRIAL_TOKEN.fullmatch(token)
        if match is None:
            return None
        trial_id, lease_id, mac = match.groups()
        if not hmac.compare_digest(mac, self._mac(f"trial:{int(trial_id)}:{lease_id}")):
            return None
        return Principal("trial", trial_id=int(trial_id), lease_id=lease_id)

    # -- dashboard sessions ---------------------------------------------------------------------

    def start_session(self, token_hash: str) -> str:
        """A new session for the token (blocking); answers the cookie's value, a random id. Expired
        sessions are deleted on the way, so the table holds at most a sign-in's worth of them."""
        cookie = secrets.token_urlsafe(32)
        now = time.time()
        with self._db.transaction() as session:
            session.execute(delete(DashboardSession).where(DashboardSession.expires_at <= now))
            session.add(
                DashboardSession(id_hash=hash_token(cookie), token_hash=token_hash, expires_at=now + SESSION_SECONDS)
            )
        return cookie

    def end_session(self, cookie: str) -> None:
        """Sign-out (blocking): the session stops working on every server at once."""
        with self._db.transaction() as session:
            session.execute(delete(DashboardSession).where(DashboardSession.id_hash == hash_token(cookie)))

    def session_principal(self, cookie: str) -> Principal | None:
        """The signed-in token's principal, while the session exists, has not expired and its token
        is still active (blocking: one primary-key lookup, never cached, so sign-out holds at once)."""
        if not cookie or len(cookie) > 100:
            return None
        id_hash = hash_token(cookie)
        with self._db.transaction() as session:
            row = session.execute(
                select(DashboardSession.token_hash).where(
                    DashboardSession.id_hash == id_hash, DashboardSession.expires_at > time.time()
                )
            ).first()
        principal = None if row is None else self._by_hash(str(row.token_hash))
        return None if principal is None else dataclasses.replace(principal, session=id_hash)

    def csrf_token(self, session_id_hash: str) -> str:
        """The value a signed-in page must echo on writes (header `X-HPO-CSRF` or form field `csrf`):
        a MAC of the session, so it changes with every sign-in."""
        return self._mac(f"csrf:{session_id_hash}")

    def _mac(self, message: str) -> str:
        digest = hmac.new(self._key, message.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
