"""The service's one error hierarchy. Domain code raises these; `hpo.server.api.errors` maps them
to HTTP status codes in exactly one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    """One reason a request was refused: `field` is a path such as `hyperparameters[2].min`."""

    field: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "reason": self.reason}


class HpoError(Exception):
    """Base of every error the service reports to a client."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(HpoError):
    """The request is well-formed JSON but its content is refused (HTTP 422)."""

    def __init__(self, errors: list[FieldError]) -> None:
        if not errors:
            raise ValueError("InvalidInput needs at least one FieldError")
        super().__init__("; ".join(f"{e.field}: {e.reason}" for e in errors))
        self.errors = errors

    @classmethod
    def one(cls, field: str, reason: str) -> InvalidInput:
        return cls([FieldError(field, reason)])


class NotFound(HpoError):
    """An id names nothing (HTTP 404)."""


class AlreadyExists(HpoError):
    """A unique name is taken (HTTP 409)."""


class Conflict(HpoError):
    """The request is valid but the resource's state refuses it, e.g. a finished trial (HTTP 409)."""


class Forbidden(HpoError):
    """The caller's credential may not do this, e.g. a trial token writing under another lease (HTTP 403)."""


class LeaseLost(Conflict):
    """A worker wrote with a lease that is no longer its own (HTTP 409); it must stop that run."""


class QuotaExceeded(HpoError):
    """A write would take a trial past a limit of the server's, e.g. its metric points (HTTP 413)."""


def one_line(exc: BaseException) -> str:
    """An error as one log line: the driver's own first line (a database outage is a condition to
    report, not a bug to trace: docs/workers.md, "Database outages")."""
    cause = exc.__cause__ or exc
    text = str(getattr(cause, "orig", None) or cause).strip().splitlines()
    return f"{type(getattr(cause, 'orig', None) or cause).__name__}: {text[0] if text else ''}"[:500]


class StorageError(HpoError):
    """The database refused or failed in a way the client cannot fix (HTTP 503)."""
