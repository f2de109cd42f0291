"""The HTTP side of rank 0: the trainer's `Reporter` under a worker.

The trainer always appends `{"step", "name", "value"}` lines to `out_dir/metrics.jsonl`; this
reporter tails that file by byte offset and POSTs the new points in batches, flushed when
`flush_points` points were reported or every `flush_seconds`. The offset advances only after the
server accepted a batch, so during a server outage the points wait on disk, not in memory: memory
holds at most one batch (`max_batch`) however long the outage (docs/workers.md, "Faults": "points
wait in `metrics.jsonl` on disk (memory holds one batch at most)"). Delivery retries with backoff on
its own thread; training never waits for the server.

Checkpoint records are POSTed only after every metric point up to and including their step was
delivered: the server resumes a killed trial from its newest recorded checkpoint and deletes the
points above that step, so a checkpoint recorded ahead of its points would leave a gap."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from .artifacts import checkpoint_uri
from .client import Backoff, LeaseLost, ProtocolError, ServerClient, ServerUnavailable

_log = logging.getLogger("hpo.worker.reporter")

# Delivery cadence: a batch every FLUSH_SECONDS, sooner once FLUSH_POINTS points wait. Few, large
# batches: each wakes the reporter thread inside the training process, and while it holds the GIL
# the training thread waits at every torch call; at 512 points a batch, a fast trainer lost 8 % of
# its throughput to them, at 5,000 (one batch every 2 s) nothing measurable.
FLUSH_POINTS = 5000
FLUSH_SECONDS = 2.0
MAX_LINE_BYTES = 64 * 1024


@dataclass
class Undelivered:
    """What rank 0 could not deliver before its run ended; the driver delivers it before it
    completes the trial. `checkpoints` are `(step, uri, objective)` in the order they were made."""

    points: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[tuple[int, str, float | None]] = field(default_factory=list)
    # Steps whose files are gone but whose records the server may hold, and the newest record that
    # still exists to carry their deletion when no new checkpoint is left to.
    deleted: list[int] = field(default_factory=list)
    carrier: tuple[int, str, float | None] | None = None

    def __bool__(self) -> bool:
        return bool(self.points or self.checkpoints or self.deleted)


class MetricsTail:
    """Whole lines of a JSON-lines metrics file from a byte offset. A line without its newline is
    left for later (the writer may be mid-line); unparsable lines are skipped with a warning.
    `opener` opens the file (None when it is not there); by default, by its path. The supervisor
    passes one that never follows a link in the trial's folder (worker/trial_tree.py)."""

    def __init__(self, path: Path, max_points: int = 5000, opener: Callable[[], BinaryIO | None] | None = None) -> None:
        self.path = path
        self.max_points = max_points
        self.offset = 0
        self.opener = opener or self._open

    def _open(self) -> BinaryIO | None:
        try:
            return self.path.open("rb")
        except FileNotFoundError:
            return None

    def read(self) -> tuple[list[dict[str, Any]], int]:
        """Up to `max_points` points after `offset`, and the offset just past them (not yet taken)."""
        points: list[dict[str, Any]] = []
        end = self.offset
        handle = self.opener()
        if handle is None:
            return points, end
        with handle:
            handle.seek(self.offset)
            while len(points) < self.max_points:
                line = handle.readline(MAX_LINE_BYTES)
                if len(line) == MAX_LINE_BYTES and not line.endswith(b"\n"):
                    end += len(line)  # no point is this long: skipped in pieces, never held whole
                    continue
                if not line.endswith(b"\n"):
                    break
                end += len(line)
                point = _parse(line)
                if point is not None:
                    points.append(point)
        return points, end

    def advance(self, offset: int) -> None:
        self.offset = offset


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        raw = json.loads(line)
        value = raw["value"]
        return {"step": int(raw["step"]), "name": str(raw["name"]), "value": float("nan" if value is None else value)}
    except (ValueError, KeyError, TypeError):
        _log.warning("skipping a metrics line that is not {step, name, value}: %r", line[:200])
        return None


class HttpReporter:
    """`Reporter` for rank 0 (trainer contract: `metrics`, `checkpoint`, `should_stop`).

    `stop_requested` is polled by `should_stop` (the driver's stop flag); a 409 on any write also
    stops the run, since the lease is gone. Call `start()` before training and `close()` after."""

    def __init__(
        self,
        client: ServerClient,
        trial_id: int,
        lease_id: str,
        metrics_path: Path,
        artifact_root: Path,
        stop_requested: Callable[[], bool] | None = None,
        *,
        flush_points: int = FLUSH_POINTS,
        flush_seconds: float = FLUSH_SECONDS,
        max_batch: int = 5000,
    ) -> None:
        self._client, self._trial_id, self._lease_id = client, trial_id, lease_id
        self._root = artifact_root
        self._tail = MetricsTail(metrics_path, max_batch)
        self._stop_requested = stop_requested
        self._flush_points, self._flush_seconds = flush_points, flush_seconds
        self._checkpoints: deque[tuple[int, str, float | None]] = deque()
        self._deleted: set[int] = set()  # steps whose files retention deleted, not yet told
        # The runner tells of new and deleted checkpoints while the flush thread posts them.
        self._records_lock = threading.Lock()
        self._recorded: dict[int, tuple[str, float | None]] = {}  # records the server holds: uri, objective
        self._delivered_step = -1
        self._unflushed = 0  # points reported and not yet sent (the trainer's thread adds, the flush's subtracts)
        self._count_lock = threading.Lock()
        self._wake, self._closing = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._flush_loop, name=f"hpo-reporter-{trial_id}", daemon=True)
        self.lease_lost = False
        self.first_step_at: float | None = None
        self.delivered_points = 0
        # The step of the newest checkpoint the server recorded: the one a later attempt resumes
        # from, which retention must not delete (worker/command.py).
        self.newest_recorded: int | None = None

    # -- Reporter protocol (called by the trainer on rank 0) -----------------------------------

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Counts the points toward the next flush; the points themselves are read from the file."""
        if self.first_step_at is None:
            self.first_step_at = time.time()
        with self._count_lock:
            self._unflushed += len(values)
            due = self._unflushed >= self._flush_points
        if due:
            self._wake.set()

    def checkpoint(self, step: int, path: str | Path, objective_value: float | None) -> None:
        """Queues the record; it is sent once the points up to `step` are delivered."""
        with self._records_lock:
            self._checkpoints.append((int(step), checkpoint_uri(self._root, Path(path)), objective_value))
        self._wake.set()

    def checkpoints_deleted(self, steps: list[int]) -> None:
        """These steps' files are gone: records not yet sent are dropped, the others are deleted on
        the server with the next delivery (with the next record, or by re-sending the newest
        surviving one), so the server does not offer a deleted file as a resume point."""
        gone = set(steps)
        with self._records_lock:
            self._checkpoints = deque(c for c in self._checkpoints if c[0] not in gone)
            self._deleted |= gone
        self._wake.set()

    def should_stop(self) -> bool:
        if self.lease_lost:
            return True
        return self._stop_requested is not None and self._stop_requested()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> HttpReporter:
        self._thread.start()
        return self

    def close(self, deliver_for: float = 20.0) -> Undelivered:
        """Stops the flush thread, delivers what is left for up to `deliver_for` seconds, and
        answers what could not be delivered (nothing when the lease is lost: it is not ours)."""
        self._closing.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.lease_lost:
            return Undelivered()
        try:
            self._deliver(final=True, retry_for=deliver_for)
        except ServerUnavailable as exc:
            _log.warning(
                "trial %d: server unreachable at the end of the run (%s); the worker delivers the rest",
                self._trial_id,
                exc,
            )
        except LeaseLost:
            self.lease_lost = True
            return Undelivered()
        return self._leftovers()

    # -- delivery -----------------------------------------------------------------------------

    def _flush_loop(self) -> None:
        delays = Backoff(initial=1.0, maximum=30.0).delays()
        while not self._closing.is_set():
            self._wake.wait(self._flush_seconds)
            self._wake.clear()
            if self._closing.is_set():
                return  # close() makes the final delivery itself, on its own deadline
            try:
                self._deliver(final=False, retry_for=0)
                delays = Backoff(initial=1.0, maximum=30.0).delays()
            except ServerUnavailable as exc:
                delay = next(delays)
                _log.warning("trial %d: %s; retrying in %.1f s (points wait on disk)", self._trial_id, exc, delay)
                self._closing.wait(delay)
            except LeaseLost:
                _log.warning("trial %d: lease %s lost; stopping the run", self._trial_id, self._lease_id)
                self.lease_lost = True
                return

    def _deliver(self, final: bool, retry_for: float) -> None:
        """Sends the whole points now in the file, then the checkpoint records they cover. Stops
        after a batch that was not full: a script that appends a line every few milliseconds would
        otherwise keep this loop busy for ever, and the checkpoint records behind it would wait."""
        while True:
            points, end = self._tail.read()
            if points:
                self._send_points(points, retry_for)
            self._tail.advance(end)
            if len(points) < self._tail.max_points:
                break
        while (entry := self._next_record(final)) is not None:
            step, uri, objective = entry
            with self._records_lock:
                deleted = sorted(self._deleted)
            try:
                self._client.post_checkpoint(self._trial_id, self._lease_id, step, uri, objective, retry_for, deleted)
                with self._records_lock:
                    self._recorded[step] = (uri, objective)
                    self._forget(deleted)
            except ProtocolError as exc:
                if isinstance(exc, LeaseLost):
                    raise
                _log.error("trial %d: checkpoint at step %d refused, not recorded: %s", self._trial_id, step, exc)
            with self._records_lock:
                # The entry itself, not the queue's head: a deletion may have rebuilt the queue meanwhile.
                if entry in self._checkpoints:
                    self._checkpoints.remove(entry)
        with self._records_lock:
            pending_deletions = bool(self._deleted) and not self._checkpoints
        if pending_deletions:
            self._send_deletions(retry_for)

    def _next_record(self, final: bool) -> tuple[int, str, float | None] | None:
        """The next checkpoint record to post: once every point up to its step was delivered."""
        with self._records_lock:
            if self._checkpoints and (final or self._checkpoints[0][0] < self._delivered_step):
                return self._checkpoints[0]
        return None

    def _send_deletions(self, retry_for: float) -> None:
        """Deletes the records of deleted files now, by re-sending the newest surviving record (the
        call is idempotent on its step) with them; with no surviving record, the next one carries them."""
        with self._records_lock:
            surviving = [step for step in self._recorded if step not in self._deleted]
            if not surviving:
                return
            step = max(surviving)
            uri, objective = self._recorded[step]
            deleted = sorted(self._deleted)
        try:
            self._client.post_checkpoint(self._trial_id, self._lease_id, step, uri, objective, retry_for, deleted)
        except ProtocolError as exc:
            if isinstance(exc, LeaseLost):
                raise
            _log.error("trial %d: deleting checkpoint records %s refused: %s", self._trial_id, deleted, exc)
            return
        with self._records_lock:
            self._forget(deleted)

    def _forget(self, deleted: list[int]) -> None:
        self._deleted -= set(deleted)
        for step in deleted:
            self._recorded.pop(step, None)
        self.newest_recorded = max(self._recorded) if self._recorded else None

    def _send_points(self, points: list[dict[str, Any]], retry_for: float) -> None:
        try:
            self._client.post_metrics(self._trial_id, self._lease_id, points, retry_for)
        except ProtocolError as exc:
            if isinstance(exc, LeaseLost):
                raise
            # A refused batch (a name over 200 characters, say) would block every later point.
            _log.error("trial %d: %d metric points refused, dropped: %s", self._trial_id, len(points), exc)
        self.delivered_points += len(points)
        self._delivered_step = max(self._delivered_step, max(p["step"] for p in points))
        # Less what was sent, not zero: points reported while this batch was read and sent are
        # still to send (a reset lost them, and the next flush waited for flush_seconds).
        with self._count_lock:
            self._unflushed = max(0, self._unflushed - len(points))

    def _leftovers(self) -> Undelivered:
        with self._records_lock:
            left = Undelivered(checkpoints=list(self._checkpoints), deleted=sorted(self._deleted))
            surviving = [step for step in self._recorded if step not in self._deleted]
            if surviving:
                left.carrier = (max(surviving), *self._recorded[max(surviving)])
        while True:
            points, end = self._tail.read()
            self._tail.advance(end)
            if not points:
                return left
            left.points.extend(points)
