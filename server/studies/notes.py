"""Notes people keep on a study or a trial (why it ran, what it showed): one text per target,
replaced whole on each save. Stored in `notes` with `trial_id` 0 for the study itself."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from sqlalchemy import select

from hpo.server.db import Database
from hpo.server.errors import InvalidInput, NotFound
from hpo.server.models import Note, Study, Trial

MAX_NOTE_CHARS = 20_000
STUDY_NOTE = 0
# CommonMark (with tables and strikethrough) and no raw HTML: a `<script>` or `<img onerror>` in a
# note is shown as text, never run; markdown-it's link check refuses javascript:, vbscript:, file:
# and non-image data: URLs.
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
# Images load only from the dashboard's own origin (a path, `/static/x.png` or `x.png`) or a data:
# image: a remote one would tell its host who read the note, and when. Any other image is shown as
# a link to it, named by its alt text (plain text inside a link, where an <a> cannot nest). The
# pages' Content-Security-Policy (img-src 'self' data: blob:) holds the same line in the browser
# (docs/security.md, "The dashboard").
_DATA_IMAGE = re.compile(r"data:image/(?:gif|png|jpeg|webp);", re.IGNORECASE)
_PATH = re.compile(r"(?![/\\]{2})[^\x00-\x20\x7f\\:]*(?:[/?#][^\x00-\x20\x7f\\]*)?")


def same_origin_image(src: str) -> bool:
    """Whether an image's URL loads from the page's own origin (a path with no scheme or host, which
    a browser cannot read as one either: no `//`, no backslash, no space or control character) or is
    a data: image."""
    return bool(_DATA_IMAGE.match(src) or _PATH.fullmatch(src))


def _image(self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
    token = tokens[idx]
    src = str(token.attrGet("src") or "")
    if same_origin_image(src):
        return self.image(tokens, idx, options, env)
    alt = escapeHtml(self.renderInlineAsText(token.children or [], options, env) or src)
    depth = sum(t.nesting for t in tokens[:idx] if t.type in ("link_open", "link_close"))
    if depth > 0:  # already inside a link
        return alt
    return f'<a href="{escapeHtml(src)}" rel="nofollow noopener noreferrer">{alt}</a>'


_MARKDOWN.add_render_rule("image", _image)


def render(body: str | None) -> str:
    """A note's Markdown as HTML that is safe to insert into a page (raw HTML escaped)."""
    return _MARKDOWN.render(body or "")


def _target(session: Any, study_id: int | None, trial_id: int | None) -> tuple[int, int]:
    if trial_id is not None:
        trial = session.get(Trial, trial_id)
        if trial is None:
            raise NotFound(f"trial {trial_id} not found")
        return trial.study_id, trial_id
    assert study_id is not None
    if session.get(Study, study_id) is None:
        raise NotFound(f"study {study_id} not found")
    return study_id, STUDY_NOTE


def get_note(db: Database, *, study_id: int | None = None, trial_id: int | None = None) -> dict[str, Any]:
    """`{body, updated_at, author, html}` of the note on a study or a trial ("" and None when none
    was written)."""
    with db.transaction() as session:
        key = _target(session, study_id, trial_id)
        note = session.get(Note, key)
        return _public(note)


def set_note(
    db: Database,
    body: str,
    *,
    author: str | None = None,
    study_id: int | None = None,
    trial_id: int | None = None,
) -> dict[str, Any]:
    """Replaces the note, signed by `author` (hpo.server.auth.tokens.author_name: the writer's token
    name, None without authentication); an empty body keeps an empty note (the history is the
    writer's)."""
    if len(body) > MAX_NOTE_CHARS:
        raise InvalidInput.one("body", f"a note holds at most {MAX_NOTE_CHARS} characters, got {len(body)}")
    with db.transaction() as session:
        key = _target(session, study_id, trial_id)
        note = session.get(Note, key)
        now = datetime.now(timezone.utc)
        if note is None:
            note = Note(study_id=key[0], trial_id=key[1], body=body, updated_at=now, author=author)
            session.add(note)
        else:
            note.body, note.updated_at, note.author = body, now, author
        session.flush()
        return _public(note)


def study_notes(db: Database, study_id: int) -> dict[int, str]:
    """Every non-empty note of a study's trials, by trial id (for the trial table)."""
    with db.transaction() as session:
        rows = session.execute(
            select(Note.trial_id, Note.body).where(Note.study_id == study_id, Note.trial_id != STUDY_NOTE)
        ).all()
        return {r.trial_id: r.body for r in rows if r.body}


def _public(note: Note | None) -> dict[str, Any]:
    if note is None:
        return {"body": "", "updated_at": None, "author": None, "html": ""}
    return {"body": note.body, "updated_at": _utc(note.updated_at), "author": note.author, "html": render(note.body)}


def _utc(at: datetime | None) -> str | None:
    """ISO 8601 in UTC whatever the connection's time zone (SQLite hands back naive UTC)."""
    if at is None:
        return None
    return (at.replace(tzinfo=timezone.utc) if at.tzinfo is None else at.astimezone(timezone.utc)).isoformat()
