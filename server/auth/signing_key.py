"""The server's signing key (trial tokens, CSRF tokens), kept outside the database: a read-only copy
of the database (a backup, a replica, a dump handed to someone) must not let anyone forge them.

`HPO_SESSION_SECRET` when set; otherwise the key file (`HPO_SESSION_SECRET_FILE`, by default
`~/.local/state/hpo/session-secret`), generated at the first start with mode 0600. Several
processes may start at once (`hpo server --workers N`, or two servers on one host): the file is
written whole under a temporary name and then linked into place, which fails if another process
linked first, so every process ends up reading the one key that won. Servers on different hosts
must be given the same key (the variable, or a copy of the file): a trial token signed by one and
checked by another would be refused."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from pathlib import Path

MIN_LENGTH = 32
_log = logging.getLogger("hpo.server")


class SigningKeyError(Exception):
    """The key file cannot be read or created; the message says what to do."""


def load(configured: str | None, path: Path) -> bytes:
    """The key: `configured` (HPO_SESSION_SECRET) when given, else the file's, created if missing."""
    if configured:
        return configured.encode()
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    try:
        _create(path)
        return _read(path)
    except OSError as exc:
        raise SigningKeyError(
            f"cannot create the signing key file {path} ({exc.strerror or exc}): set HPO_SESSION_SECRET_FILE to a "
            "writable path, or HPO_SESSION_SECRET (e.g. `openssl rand -hex 32`)"
        ) from None


def _read(path: Path) -> bytes:
    for _ in range(50):  # a file created by O_EXCL alone (no hard links) may be read before it is written
        try:
            text = path.read_text().strip()
        except PermissionError:
            raise SigningKeyError(f"cannot read the signing key file {path}: permission denied") from None
        if len(text) >= MIN_LENGTH:
            _warn_if_readable(path)
            return text.encode()
        time.sleep(0.02)
    raise SigningKeyError(
        f"the signing key file {path} holds fewer than {MIN_LENGTH} characters: delete it to have a new key "
        "generated, or write one into it (`openssl rand -hex 32`)"
    )


def _create(path: Path) -> None:
    """Writes a new random key to `path` unless some process already has."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = (secrets.token_hex(32) + "\n").encode()
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    _write_new(temporary, key)
    try:
        os.link(temporary, path)  # atomic, and never replaces a key another process linked first
    except FileExistsError:
        pass
    except OSError:  # a filesystem without hard links: create the file itself exclusively
        with contextlib.suppress(FileExistsError):
            _write_new(path, key)
    finally:
        temporary.unlink(missing_ok=True)


def _write_new(path: Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _warn_if_readable(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & 0o077:
        _log.warning("the signing key file %s is readable by other users (mode %o): chmod 600 it", path, mode & 0o777)
