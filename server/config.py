"""The server's own settings: its slow-client deadlines and limits, the metric quota and where the
signing key lives.
Read once from the `HPO_*`
environment like `hpo.settings.Settings` (which holds what server and workers share) and passed in
to `create_app` and the HTTP protocol."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpo.settings import SettingsError
from hpo.settings import number_setting as _number


@dataclass(frozen=True)
class ServerSettings:
    # Request line and headers must arrive within this many seconds of a connection opening (or
    # of a new request starting on a kept-alive one); the connection is closed otherwise.
    header_seconds: float = 10.0
    # The whole body must arrive within this many seconds of the headers' end (408 otherwise).
    body_seconds: float = 30.0
    # Requests without a valid credential in progress at once, per server process, once tokens
    # exist (sign-in page and form, sign-out, static files); more answer 503 at once.
    max_unauthenticated: int = 32
    # Uploads in flight (requests whose body is still arriving) per token, per server process;
    # more of that token's answer 503 at once, other tokens' requests are served.
    max_uploads_per_token: int = 64
    # Hyperparameter values a study's layout may hold (trials x hyperparameters); a spec past it
    # is refused with 422 (`hpo.server.studies.service.cost_errors`).
    max_spec_cells: int = 2_000_000
    # Metric points one trial may hold; a batch that would pass it is refused whole (413).
    max_points_per_trial: int = 5_000_000
    # The signing key's file when HPO_SESSION_SECRET is unset; None: `default_secret_file()`.
    session_secret_file: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServerSettings:
        """Reads `HPO_HEADER_SECONDS`, `HPO_BODY_SECONDS`, `HPO_MAX_UNAUTHENTICATED`,
        `HPO_MAX_UPLOADS_PER_TOKEN`, `HPO_MAX_SPEC_CELLS`, `HPO_MAX_POINTS_PER_TRIAL` and
        `HPO_SESSION_SECRET_FILE`; fails fast naming the variable."""
        env = os.environ if environ is None else environ
        defaults = cls()
        secret_file = env.get("HPO_SESSION_SECRET_FILE") or None
        settings = cls(
            header_seconds=_number(env, "HPO_HEADER_SECONDS", defaults.header_seconds),
            body_seconds=_number(env, "HPO_BODY_SECONDS", defaults.body_seconds),
            max_unauthenticated=_integer(env, "HPO_MAX_UNAUTHENTICATED", defaults.max_unauthenticated),
            max_uploads_per_token=_integer(env, "HPO_MAX_UPLOADS_PER_TOKEN", defaults.max_uploads_per_token),
            max_spec_cells=_integer(env, "HPO_MAX_SPEC_CELLS", defaults.max_spec_cells),
            max_points_per_trial=_integer(env, "HPO_MAX_POINTS_PER_TRIAL", defaults.max_points_per_trial),
            session_secret_file=Path(secret_file).expanduser() if secret_file else None,
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        for name, value in (("HPO_HEADER_SECONDS", self.header_seconds), ("HPO_BODY_SECONDS", self.body_seconds)):
            if not 0.1 <= value <= 3600:
                raise SettingsError(f"{name} must be between 0.1 and 3600 seconds, got {value:g}")
        if not 1 <= self.max_unauthenticated <= 100_000:
            raise SettingsError(f"HPO_MAX_UNAUTHENTICATED must be between 1 and 100000, got {self.max_unauthenticated}")
        if not 1 <= self.max_uploads_per_token <= 100_000:
            raise SettingsError(
                f"HPO_MAX_UPLOADS_PER_TOKEN must be between 1 and 100000, got {self.max_uploads_per_token}"
            )
        if not 1 <= self.max_spec_cells <= 2**31 - 1:
            raise SettingsError(f"HPO_MAX_SPEC_CELLS must be between 1 and 2147483647, got {self.max_spec_cells}")
        if not 1 <= self.max_points_per_trial <= 2**31 - 1:
            raise SettingsError(
                f"HPO_MAX_POINTS_PER_TRIAL must be between 1 and 2147483647, got {self.max_points_per_trial}"
            )

    @property
    def secret_file(self) -> Path:
        return self.session_secret_file or default_secret_file()


def default_secret_file(environ: Mapping[str, str] | None = None) -> Path:
    """`$XDG_STATE_HOME/hpo/session-secret`, by default `~/.local/state/hpo/session-secret`: the
    server user's own state, apart from the database (a copy of which must not carry the key) and
    from the artifact root (which trials write and read)."""
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(state) / "hpo" / "session-secret"


def _integer(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw.replace("_", ""))
    except ValueError:
        raise SettingsError(f"{name} must be a whole number, got {raw!r}") from None
