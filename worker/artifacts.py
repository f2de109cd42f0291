"""Where a trial's files live: `HPO_ARTIFACT_ROOT/trials/{trial_id}/attempt-{n}/` (docs/workers.md,
"Shared storage"; `artifact_path` in docs/worker-protocol.md, "1. Claim").

Every path is built from integer ids, never from user strings (study names, params, URIs sent back
by the server), so no spec can make a worker write outside the artifact root. Checkpoint URIs are
recorded relative to the root, so nodes that mount the shared root at different places agree."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath


class ArtifactPathError(ValueError):
    """A path or URI points outside the place the ids allow."""


def _positive(name: str, value: object) -> int:
    # bool is an int subclass; an id of True is a bug upstream, not an id.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArtifactPathError(f"{name} must be a positive integer, got {value!r}")
    return value


def trial_dir(root: Path, trial_id: int) -> Path:
    """`root/trials/{trial_id}`; `root` is made absolute so Ray tasks on any node see one path."""
    return root.absolute() / "trials" / str(_positive("trial_id", trial_id))


def attempt_dir(root: Path, trial_id: int, attempt: int) -> Path:
    """`root/trials/{trial_id}/attempt-{attempt}`: the only folder an attempt writes to."""
    return trial_dir(root, trial_id) / f"attempt-{_positive('attempt', attempt)}"


def relative_attempt_path(trial_id: int, attempt: int) -> str:
    """The same folder relative to the root, as the server names it in a claim's `artifact_path`."""
    return f"trials/{_positive('trial_id', trial_id)}/attempt-{_positive('attempt', attempt)}"


def checkpoint_uri(root: Path, path: Path) -> str:
    """The URI recorded for a checkpoint: POSIX path relative to `root` when it lies inside it
    (the normal case), else the absolute path."""
    absolute = path.absolute()
    try:
        return absolute.relative_to(root.absolute()).as_posix()
    except ValueError:
        return str(absolute)


def resolve_checkpoint(root: Path, trial_id: int, uri: str) -> Path:
    """The local path of a checkpoint URI from a claim's `resume_from`.

    Raises `ArtifactPathError` unless it lies under this trial's folder once `..` and symlinks are
    resolved: the URI travels through the server, so it is checked, not trusted."""
    if not uri or "\x00" in uri:
        raise ArtifactPathError(f"bad checkpoint uri {uri!r}")
    candidate = Path(uri) if PurePosixPath(uri).is_absolute() else root.absolute() / PurePosixPath(uri)
    resolved = candidate.resolve()
    allowed = trial_dir(root, trial_id).resolve()
    if not resolved.is_relative_to(allowed):
        raise ArtifactPathError(f"checkpoint uri {uri!r} is outside {allowed}")
    return resolved


_STEP_IN_NAME = re.compile(r"step-(\d+)")


def fallback_checkpoint(missing: Path, max_step: int) -> Path | None:
    """The newest checkpoint beside `missing` whose name says `step-N` with N <= `max_step`.

    The trainer prunes checkpoints that are neither among the best nor the newest, while the
    reporter records a checkpoint only after the points it covers were delivered; so the server's
    newest record can name a file already pruned when a worker dies. Resuming from an older kept
    checkpoint replays the steps in between, which the idempotent metric upsert absorbs: still no
    gap and no duplicate."""
    best: tuple[int, Path] | None = None
    if not missing.parent.is_dir():
        return None
    for path in missing.parent.iterdir():
        match = _STEP_IN_NAME.search(path.name)
        # A file, or a folder for scripts whose checkpoints are folders (Hugging Face, Lightning).
        if match is None or ".tmp" in path.name or not (path.is_file() or path.is_dir()):
            continue
        step = int(match.group(1))
        if step <= max_step and (best is None or step > best[0]):
            best = (step, path)
    return None if best is None else best[1]
