"""The trainer's one user-facing error type (no torch import: the CLI and the worker load it cheaply)."""

from __future__ import annotations


class ConfigError(ValueError):
    """The run's config cannot be trained as written: an unknown workload, optimizer, schedule or
    hyperparameter, a value out of range, a batch size the world size does not divide.

    `train()` raises it before the first training step; the worker reports it as kind `config`,
    which the server never retries (docs/worker-protocol.md, "The lifecycle of a trial")."""
