"""Sessions and the signing key (docs/security.md, "The dashboard" and "The signing key") over real
HTTP: a dashboard session ends at sign-out and when its token is revoked, on every server sharing
the database; the signing key lives in a file (or the environment), never in the database, and
processes starting together agree on it; a weak HPO_API_TOKEN is refused on an address others can
reach."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from alembic import command
from sqlalchemy import inspect, text

from hpo.cli import main
from hpo.server.auth import signing_key
from hpo.server.auth import tokens as auth
from hpo.server.config import ServerSettings
from hpo.server.db import Database, alembic_config
from hpo.settings import Settings
from tests.conftest import LiveServer, free_port
from tests.server.factories import study_spec

API = "/api/v1"


def _sign_in(http: httpx.Client, token: str) -> tuple[str, str]:
    """Signs in through the form; answers (session cookie, CSRF token)."""
    answer = http.post("/signin", data={"token": token, "next": "/"})
    assert answer.status_code == 303, answer.text
    return http.cookies["hpo_session"], http.cookies["hpo_csrf"]


def _as_cookie(session: str) -> dict[str, str]:
    return {"Cookie": f"hpo_session={session}"}


@pytest.fixture
def write_token(settings: Settings) -> Iterator[tuple[Database, auth.TokenInfo, str]]:
    db = Database(settings.database_url)
    db.upgrade()
    info, token = auth.create_token(db, "write", "alice")
    yield db, info, token
    db.dispose()


def test_sign_out_ends_the_session_on_every_server(postgres_url: str, tmp_path: Path) -> None:
    db = Database(postgres_url)
    _, token = auth.create_token(db, "write", "alice")
    db.dispose()
    settings = Settings(database_url=postgres_url, artifact_root=tmp_path / "artifacts")
    shared_key = ServerSettings(session_secret_file=tmp_path / "key")
    with (
        LiveServer(settings, shared_key) as first,
        LiveServer(settings, shared_key) as second,
        httpx.Client(base_url=first.url, timeout=30) as browser,
    ):
        session, csrf = _sign_in(browser, token)
        for server in (first, second):
            assert httpx.get(f"{server.url}{API}/studies", headers=_as_cookie(session)).status_code == 200
        # A write from the page works on either server with the session's CSRF token.
        write = {**_as_cookie(session), "X-HPO-CSRF": csrf}
        created = httpx.post(f"{second.url}{API}/studies", json=study_spec(name="s", num_trials=1), headers=write)
        assert created.status_code == 201, created.text
        assert browser.post("/signout", data={"csrf": csrf}).status_code == 303
        # No cache to wait for: the copied cookie is refused at once, here and on the other server.
        for server in (first, second):
            assert httpx.get(f"{server.url}{API}/studies", headers=_as_cookie(session)).status_code == 401
            refused = httpx.post(f"{server.url}{API}/studies", json=study_spec(name="t"), headers=write)
            assert refused.status_code == 401
        # Signing in again makes a new session with a new CSRF token; the old one is worth nothing.
        again, new_csrf = _sign_in(browser, token)
        assert again != session and new_csrf != csrf
        stale = {**_as_cookie(again), "X-HPO-CSRF": csrf}
        assert httpx.post(f"{second.url}{API}/studies", json=study_spec(name="u"), headers=stale).status_code == 403


def test_revoking_the_token_ends_its_sessions(
    settings: Settings, write_token: tuple[Database, auth.TokenInfo, str]
) -> None:
    db, info, token = write_token
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as browser:
        session, _ = _sign_in(browser, token)
        assert browser.get(f"{API}/studies").status_code == 200
        auth.revoke_token(db, info.id)
        with db.transaction() as rows:  # the rows go with the token, not only the cached role
            assert rows.execute(text("SELECT count(*) FROM dashboard_sessions")).scalar() == 0
        assert httpx.get(f"{live.url}{API}/studies", headers=_as_cookie(session)).status_code == 401


def test_a_made_up_or_expired_session_is_refused(
    settings: Settings, write_token: tuple[Database, auth.TokenInfo, str]
) -> None:
    db, _, token = write_token
    with LiveServer(settings) as live, httpx.Client(base_url=live.url, timeout=30) as browser:
        session, _ = _sign_in(browser, token)
        with db.transaction() as rows:
            rows.execute(text("UPDATE dashboard_sessions SET expires_at = 1"))
        for cookie in (session, "x" * 43, "", "é" * 500):
            answer = httpx.get(f"{live.url}{API}/studies", headers={"Cookie": f"hpo_session={cookie}".encode()})
            assert answer.status_code == 401, cookie


# --- the signing key ---------------------------------------------------------------------------


def test_the_signing_key_is_a_0600_file_and_never_in_the_database(tmp_path: Path) -> None:
    database = tmp_path / "hpo.db"
    key_file = tmp_path / "state" / "hpo" / "session-secret"
    settings = Settings(database_url=f"sqlite:///{database}", artifact_root=tmp_path / "artifacts")
    db = Database(settings.database_url)
    db.upgrade()
    _, token = auth.create_token(db, "worker")
    db.dispose()
    with LiveServer(settings, ServerSettings(session_secret_file=key_file)) as live:
        spec = {"name": "k", "hyperparameters": [{"name": "x", "role": "fixed", "value": 1}]}
        headers = {"Authorization": f"Bearer {token}"}
        assert httpx.post(f"{live.url}{API}/studies", json=spec, headers=headers).status_code == 403
    key = key_file.read_text().strip()
    assert len(key) == 64 and key_file.stat().st_mode & 0o777 == 0o600
    assert key_file.parent.stat().st_mode & 0o077 == 0
    with sqlite3.connect(database) as raw:
        raw.execute("PRAGMA wal_checkpoint(FULL)")
        assert "server_secrets" not in {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
    assert key.encode() not in database.read_bytes()
    # A server restarted on the same file keeps the key (trial tokens and sessions survive it).
    with LiveServer(settings, ServerSettings(session_secret_file=key_file)):
        assert key_file.read_text().strip() == key


def _load(path: str) -> bytes:
    return signing_key.load(None, Path(path))


def test_processes_starting_together_agree_on_one_key(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(8, mp_context=context) as pool:
        for round_ in range(5):
            path = str(tmp_path / f"round-{round_}" / "session-secret")
            keys = set(pool.map(_load, [path] * 16))
            assert len(keys) == 1 and len(next(iter(keys))) == 64
            assert [p.name for p in Path(path).parent.iterdir()] == ["session-secret"]  # no temporary left


def test_hpo_session_secret_wins_and_bad_key_files_are_refused_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "key"
    assert signing_key.load("s" * 32, path) == b"s" * 32 and not path.exists()
    path.write_text("short\n")
    with pytest.raises(signing_key.SigningKeyError, match="fewer than 32 characters: delete it"):
        signing_key.load(None, path)
    monkeypatch.setenv("HPO_DATABASE_URL", f"sqlite:///{tmp_path / 'hpo.db'}")
    monkeypatch.setenv("HPO_SESSION_SECRET_FILE", "/proc/hpo/session-secret")
    assert main(["server", "--port", str(free_port())]) == 2
    error = capsys.readouterr().err
    assert "cannot create the signing key file /proc/hpo/session-secret" in error
    assert "HPO_SESSION_SECRET_FILE" in error and len(error.strip().splitlines()) == 1


def test_the_upgrade_drops_the_key_kept_in_the_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    db = Database(url)
    with db.engine.connect() as connection:
        config = alembic_config(url)
        config.attributes["connection"] = connection
        command.upgrade(config, "0005")
        connection.execute(text("INSERT INTO server_secrets (name, value) VALUES ('signing-key', :v)"), {"v": "k" * 64})
        connection.commit()
    db.upgrade()
    assert "server_secrets" not in inspect(db.engine).get_table_names()
    db.dispose()


def test_a_key_from_another_server_is_not_this_ones(settings: Settings, tmp_path: Path) -> None:
    # Servers that share a database but not a key refuse each other's trial tokens: they must be
    # given the same HPO_SESSION_SECRET or key file (docs/security.md).
    db = Database(settings.database_url)
    db.upgrade()
    one = auth.Authenticator(db, None, signing_key.load(None, tmp_path / "one"))
    other = auth.Authenticator(db, None, signing_key.load(None, tmp_path / "other"))
    same = auth.Authenticator(db, None, signing_key.load(None, tmp_path / "one"))
    token = one.trial_token(7, "lease")
    assert other.principal(token) is None
    assert same.principal(token) == auth.Principal("trial", trial_id=7, lease_id="lease")
    db.dispose()


# --- HPO_API_TOKEN on a public address -------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "reason"),
    [("x", "it has 1 characters, fewer than 32"), ("ab" * 20, "it repeats 2 different characters")],
)
def test_a_weak_api_token_is_refused_on_a_public_address(
    token: str, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HPO_DATABASE_URL", f"sqlite:///{tmp_path / 'hpo.db'}")
    monkeypatch.setenv("HPO_API_TOKEN", token)
    assert main(["server", "--host", "0.0.0.0", "--port", str(free_port()), "--insecure"]) == 2
    error = capsys.readouterr().err.strip()
    assert f"refusing to listen on 0.0.0.0 with a weak HPO_API_TOKEN ({reason})" in error
    assert "openssl rand -hex 32" in error and len(error.splitlines()) == 1
    assert not (tmp_path / "hpo.db").exists()  # refused before anything was created


def test_strong_tokens_pass_the_check_and_loopback_takes_any() -> None:
    from hpo.server.cli import _check_token_strength, token_weakness

    assert token_weakness(auth.new_token()) is None
    assert token_weakness("0123456789abcdef" * 2) is None  # 32 hex characters
    _check_token_strength("127.0.0.1", "x")  # a laptop's server: no one else reaches it
    _check_token_strength("0.0.0.0", None)  # no HPO_API_TOKEN: the "no token" check applies instead
