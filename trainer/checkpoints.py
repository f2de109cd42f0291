"""Checkpoint files: layout, atomic writes, loading, and which ones to keep.

Layout: `out_dir/checkpoints/step-{N:08d}.pt`, one `torch.save` dict each (see `loop.Trainer`
for the contents: model on CPU unwrapped from DDP, optimizer, step, every RNG state of every rank,
the data position, the evaluation history and the resolved config). Files are written to a
temporary name, fsynced, then renamed over (nanoGPT's in-place write, left behind).

Retention (playbook 000, "Saving checkpoints and retrospectively selecting the best checkpoint"):
keep the `keep_best` checkpoints with the best objective value plus the newest (for resume); all
others are deleted once a newer checkpoint is safely on disk."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .config import Objective
from .retention import kept_steps

DIRNAME = "checkpoints"
_NAME = re.compile(r"^step-(\d+)\.pt$")
FORMAT_VERSION = 1


def checkpoint_dir(out_dir: Path) -> Path:
    return out_dir / DIRNAME


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """`(step, path)` of every finished checkpoint, oldest first (temporary files are not listed)."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def remove_temporaries(directory: Path) -> None:
    """Deletes half-written files a killed run left behind."""
    if directory.is_dir():
        for path in directory.glob("*.tmp*"):
            path.unlink(missing_ok=True)


def save_atomic(state: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with tmp.open("wb") as handle:
        torch.save(dict(state), handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load(path: Path) -> dict[str, Any]:
    """Loads a checkpoint onto the CPU (tensors, numbers, strings and containers only)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path} is not an hpo trainer checkpoint (format {FORMAT_VERSION})")
    return state


def to_cpu(value: Any) -> Any:
    """A copy of nested containers with every tensor detached onto the CPU (device-independent
    checkpoints: playbook 004, "Load and save one checkpoint before training")."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def prune(
    directory: Path, objective_at: Callable[[int], float | None], keep_best: int, objective: Objective
) -> list[int]:
    """Deletes the checkpoints `kept_steps` does not keep; answers the steps deleted."""
    present = {step: path for step, path in list_checkpoints(directory)}
    keep = kept_steps({step: objective_at(step) for step in present}, keep_best, objective)
    removed = []
    for step, path in present.items():
        if step not in keep:
            path.unlink(missing_ok=True)
            removed.append(step)
    return sorted(removed)
