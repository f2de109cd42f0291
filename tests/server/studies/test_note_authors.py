"""A note carries its author (docs/dashboard.md, "Notes": the saving token's name; a dashboard
session's, the token it signed in with) and the time, in the notes API and on the study and trial
pages. Real HTTP against a server with tokens, on SQLite and Postgres."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from hpo.server.auth import tokens as auth
from hpo.server.db import Database
from hpo.settings import Settings
from tests.conftest import LiveServer
from tests.server.analysis.protocol import API, create, run_pending
from tests.server.dashboard.test_conditional_charts import adam_lr_drives, conditional_spec

ENV_ADMIN = "env-admin-" + "x" * 40


@pytest.fixture
def site(settings: Settings) -> Iterator[dict[str, Any]]:
    """A server with named tokens (alice writes, bob signs in to the dashboard, an unnamed one, a
    reader) and HPO_API_TOKEN, and one study whose trials ran."""
    db = Database(settings.database_url)
    db.upgrade()
    tokens = {
        "alice": auth.create_token(db, "write", "alice")[1],
        "bob": auth.create_token(db, "write", "bob's laptop")[1],
        "reader": auth.create_token(db, "read", "reader")[1],
    }
    unnamed, tokens["unnamed"] = auth.create_token(db, "write")
    db.dispose()
    with LiveServer(dataclasses.replace(settings, api_token=ENV_ADMIN)) as live:
        with httpx.Client(base_url=live.url, timeout=30, headers=_as(ENV_ADMIN)) as admin:
            study = create(admin, conditional_spec(num_trials=2))
            assert run_pending(admin, adam_lr_drives) == 4
        yield {"url": live.url, "tokens": tokens, "unnamed_id": unnamed.id, "study": study}


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _saved_line(html: str) -> str:
    found = re.search(r'<span class="muted small note-saved"[^>]*>(.*?)</span>', html)
    assert found is not None
    return found.group(1)


def _just_now(stamp: str) -> None:
    at = datetime.fromisoformat(stamp)
    assert at.utcoffset() == timedelta(0) and abs(datetime.now(timezone.utc) - at) < timedelta(minutes=2)


def test_a_note_names_the_token_that_saved_it_and_when(site: dict[str, Any]) -> None:
    sid, tokens = site["study"]["id"], site["tokens"]
    with httpx.Client(base_url=site["url"], timeout=30) as http:
        url = f"{API}/studies/{sid}/note"
        assert http.get(url, headers=_as(tokens["reader"])).json()["author"] is None  # nothing written yet
        saved = http.put(url, json={"body": "lr range **too narrow**"}, headers=_as(tokens["alice"]))
        assert saved.status_code == 200, saved.text
        note = saved.json()
        assert note["author"] == "alice" and "<strong>too narrow</strong>" in note["html"]
        _just_now(note["updated_at"])
        assert http.get(url, headers=_as(tokens["reader"])).json() == note
        page = http.get(f"/studies/{sid}", headers={**_as(tokens["reader"]), "Accept": "text/html"}).text
        assert _saved_line(page) == f"alice · {note['updated_at'][:16].replace('T', ' ')} UTC"

        # the last writer signs it: an unnamed token by its number, HPO_API_TOKEN by that name
        again = http.put(url, json={"body": "widen it"}, headers=_as(tokens["unnamed"])).json()
        assert again["author"] == f"token {site['unnamed_id']}" and again["body"] == "widen it"
        assert http.put(url, json={"body": "done"}, headers=_as(ENV_ADMIN)).json()["author"] == "HPO_API_TOKEN"
        refused = http.put(url, json={"body": "mine"}, headers=_as(tokens["reader"]))
        assert refused.status_code == 403
        assert http.get(url, headers=_as(tokens["reader"])).json()["body"] == "done"  # the reader wrote nothing

        trials = http.get(f"{API}/studies/{sid}/trials", headers=_as(tokens["reader"])).json()["items"]
        tid = trials[0]["id"]
        on_trial = http.put(f"{API}/trials/{tid}/note", json={"body": "best so far"}, headers=_as(tokens["alice"]))
        assert on_trial.json()["author"] == "alice"
        trial_page = http.get(f"/trials/{tid}", headers={**_as(tokens["reader"]), "Accept": "text/html"}).text
        assert _saved_line(trial_page).startswith("alice · ") and "best so far" in trial_page
        # another trial's note is its own: none written there
        other = http.get(f"{API}/trials/{trials[1]['id']}/note", headers=_as(tokens["reader"])).json()
        assert other == {"body": "", "updated_at": None, "author": None, "html": ""}


def test_a_dashboard_session_signs_with_the_token_it_signed_in_with(site: dict[str, Any]) -> None:
    sid = site["study"]["id"]
    with httpx.Client(base_url=site["url"], timeout=30) as browser:
        assert browser.post("/signin", data={"token": site["tokens"]["bob"], "next": "/"}).status_code == 303
        csrf = browser.cookies["hpo_csrf"]
        url = f"{API}/studies/{sid}/note"
        assert browser.put(url, json={"body": "no CSRF token"}).status_code == 403
        saved = browser.put(url, json={"body": "from the page"}, headers={"X-HPO-CSRF": csrf})
        assert saved.status_code == 200, saved.text
        assert saved.json()["author"] == "bob's laptop"
        page = browser.get(f"/studies/{sid}", headers={"Accept": "text/html"}).text
        assert _saved_line(page).startswith("bob&#39;s laptop · ")  # escaped like any text


def test_without_authentication_a_note_has_no_author(client: httpx.Client) -> None:
    study = create(client, conditional_spec(num_trials=2))
    saved = client.put(f"{API}/studies/{study['id']}/note", json={"body": "anyone"})
    assert saved.status_code == 200 and saved.json()["author"] is None
    page = client.get(f"/studies/{study['id']}", headers={"Accept": "text/html"}).text
    assert _saved_line(page) == f"saved {saved.json()['updated_at'][:16].replace('T', ' ')} UTC"
    fresh = create(client, {**conditional_spec(num_trials=2), "name": "fresh"})
    assert _saved_line(client.get(f"/studies/{fresh['id']}", headers={"Accept": "text/html"}).text) == ""
