"""The one settings object, read once from the `HPO_*` environment and passed in from there."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .policy import ExecutionPolicy, PolicyError


class SettingsError(ValueError):
    """An `HPO_*` variable has a value the service cannot run with."""


@dataclass(frozen=True)
class Settings:
    database_url: str = "sqlite:///./hpo.db"
    artifact_root: Path = Path("./artifacts")
    api_token: str | None = None
    lease_seconds: float = 60.0
    max_body_bytes: int = 32 * 1024 * 1024
    # Who may run code (hpo.policy): the server refuses studies naming anything outside it.
    execution_policy: ExecutionPolicy = field(default_factory=ExecutionPolicy)
    # Signs trial tokens and CSRF tokens; when unset, the key file HPO_SESSION_SECRET_FILE (server/auth/signing_key.py).
    session_secret: str | None = None
    # Child processes that fit bayesian models for this server (0: in a thread of the server itself).
    bayesian_processes: int = 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Reads `HPO_DATABASE_URL`, `HPO_ARTIFACT_ROOT`, `HPO_API_TOKEN`, `HPO_LEASE_SECONDS`,
        `HPO_MAX_BODY_BYTES`, `HPO_ALLOWED_WORKLOADS`, `HPO_ALLOWED_COMMANDS`, `HPO_SESSION_SECRET`;
        fails fast with the variable's name on a bad value."""
        env = os.environ if environ is None else environ
        defaults = cls()
        try:
            policy = ExecutionPolicy.from_env(env)
        except PolicyError as exc:
            raise SettingsError(str(exc)) from None
        settings = cls(
            database_url=env.get("HPO_DATABASE_URL", defaults.database_url),
            artifact_root=Path(env.get("HPO_ARTIFACT_ROOT", str(defaults.artifact_root))),
            api_token=env.get("HPO_API_TOKEN") or None,
            lease_seconds=number_setting(env, "HPO_LEASE_SECONDS", defaults.lease_seconds),
            max_body_bytes=int(number_setting(env, "HPO_MAX_BODY_BYTES", defaults.max_body_bytes)),
            execution_policy=policy,
            session_secret=env.get("HPO_SESSION_SECRET") or None,
            bayesian_processes=int(number_setting(env, "HPO_BAYESIAN_PROCESSES", defaults.bayesian_processes)),
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        if not self.database_url.startswith(("sqlite", "postgresql")):
            raise SettingsError(
                f"HPO_DATABASE_URL must be sqlite:///PATH or postgresql+psycopg://..., got {self.database_url!r}"
            )
        if not 1 <= self.lease_seconds <= 24 * 3600:
            raise SettingsError(f"HPO_LEASE_SECONDS must be between 1 and 86400, got {self.lease_seconds}")
        if not 0 <= self.bayesian_processes <= 64:
            raise SettingsError(f"HPO_BAYESIAN_PROCESSES must be between 0 and 64, got {self.bayesian_processes}")
        if self.max_body_bytes < 1024:
            raise SettingsError(f"HPO_MAX_BODY_BYTES must be at least 1024, got {self.max_body_bytes}")
        if self.session_secret is not None and len(self.session_secret) < 32:
            raise SettingsError("HPO_SESSION_SECRET must be at least 32 characters (e.g. `openssl rand -hex 32`)")


def number_setting(env: Mapping[str, str], name: str, default: float) -> float:
    """`name` from `env` as a number (`default` when unset or empty); SettingsError naming it otherwise."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from None
