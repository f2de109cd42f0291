"""The worker's parts that need neither Ray nor a server: artifact paths from ids, the HTTP
client's retry rules, and the reporter's batching, ordering and bounded buffering (against a
scripted fake server, httpx.MockTransport)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.worker import artifacts
from hpo.worker.client import Backoff, LeaseLost, ProtocolError, ServerClient, ServerUnavailable
from hpo.worker.reporter import HttpReporter, MetricsTail

FAST = Backoff(initial=0.01, maximum=0.02, jitter=0)

# -- artifacts ---------------------------------------------------------------------------------


def test_attempt_paths_come_from_ids_only(tmp_path: Path) -> None:
    assert artifacts.attempt_dir(tmp_path, 7, 2) == tmp_path / "trials" / "7" / "attempt-2"
    assert artifacts.relative_attempt_path(7, 2) == "trials/7/attempt-2"
    for bad in (0, -1, True, "7", 1.0):
        with pytest.raises(artifacts.ArtifactPathError):
            artifacts.attempt_dir(tmp_path, bad, 1)  # type: ignore[arg-type]


def test_checkpoint_uris_are_relative_to_the_root_and_checked_on_the_way_back(tmp_path: Path) -> None:
    ckpt = artifacts.attempt_dir(tmp_path, 3, 1) / "checkpoints" / "step-100.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.touch()
    uri = artifacts.checkpoint_uri(tmp_path, ckpt)
    assert uri == "trials/3/attempt-1/checkpoints/step-100.pt"
    assert artifacts.resolve_checkpoint(tmp_path, 3, uri) == ckpt.resolve()
    assert artifacts.resolve_checkpoint(tmp_path, 3, str(ckpt)) == ckpt.resolve()
    (tmp_path / "secret").touch()
    for hostile in ("trials/3/../../secret", "/etc/passwd", "trials/4/attempt-1/x", "", "trials/3/\x00"):
        with pytest.raises(artifacts.ArtifactPathError):
            artifacts.resolve_checkpoint(tmp_path, 3, hostile)


# -- client ------------------------------------------------------------------------------------


def scripted(answers: list[Any], seen: list[httpx.Request]) -> httpx.MockTransport:
    """Answers requests in order; an exception in the list is raised as a transport failure."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.MockTransport(handle)


def test_a_pruned_checkpoint_falls_back_to_the_newest_older_one(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for step in (100, 200, 400):
        (folder / f"step-{step:08d}.pt").write_bytes(b"x")
    (folder / "step-00000250.pt.tmp123").write_bytes(b"half")
    assert artifacts.fallback_checkpoint(folder / "step-00000300.pt", 300) == folder / "step-00000200.pt"
    assert artifacts.fallback_checkpoint(folder / "step-00000300.pt", 99) is None
    assert artifacts.fallback_checkpoint(tmp_path / "nowhere" / "step-1.pt", 300) is None


def test_client_retries_transient_failures_with_backoff() -> None:
    seen: list[httpx.Request] = []
    answers = [httpx.ConnectError("down"), httpx.Response(503), httpx.Response(200, json={"should_stop": False})]
    client = ServerClient("http://hpo", backoff=FAST, transport=scripted(answers, seen))
    assert client.heartbeat(1, "lease", retry_for=5) == {"should_stop": False}
    assert len(seen) == 3


def test_client_gives_up_after_its_budget_and_never_retries_refusals() -> None:
    seen: list[httpx.Request] = []
    client = ServerClient("http://hpo", backoff=FAST, transport=scripted([httpx.ConnectError("down")], seen))
    with pytest.raises(ServerUnavailable):
        client.heartbeat(1, "lease", retry_for=0.1)
    assert len(seen) > 1
    for status, error in ((409, LeaseLost), (422, ProtocolError), (404, ProtocolError)):
        seen.clear()
        client = ServerClient("http://hpo", backoff=FAST, transport=scripted([httpx.Response(status)], seen))
        with pytest.raises(error):
            client.complete(1, "lease", retry_for=5)
        assert len(seen) == 1


def test_client_sends_non_finite_values_as_strings_and_the_token() -> None:
    seen: list[httpx.Request] = []
    ok = httpx.Response(200, json={"accepted": 3})
    client = ServerClient("http://hpo", token="s3cret", transport=scripted([ok], seen))
    points = [{"step": 1, "name": "a", "value": v} for v in (math.nan, math.inf, -math.inf)]
    client.post_metrics(5, "lease", points)
    body = json.loads(seen[0].content)
    assert [p["value"] for p in body["points"]] == ["NaN", "Infinity", "-Infinity"]
    assert seen[0].headers["authorization"] == "Bearer s3cret"


def test_client_claim_answers_none_on_204() -> None:
    client = ServerClient("http://hpo", transport=scripted([httpx.Response(204)], []))
    assert client.claim("w", 2, 0) is None


# -- reporter ----------------------------------------------------------------------------------


class FakeServer:
    """Records metric batches and checkpoint records; `down` makes every call fail to connect."""

    def __init__(self) -> None:
        self.down = False
        self.lease_lost = False
        self.batches: list[list[dict[str, Any]]] = []
        self.events: list[tuple[str, int]] = []  # ("points", max step) / ("checkpoint", step), in order
        self.deleted: list[int] = []  # checkpoint steps reported as deleted by retention
        self.lock = threading.Lock()

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("server down")
        if self.lease_lost:
            return httpx.Response(409, json={"detail": "lease lost"})
        body = json.loads(request.content)
        with self.lock:
            if request.url.path.endswith("/metrics"):
                self.batches.append(body["points"])
                self.events.append(("points", max(p["step"] for p in body["points"])))
            else:
                self.events.append(("checkpoint", body["step"]))
                self.deleted.extend(body.get("deleted_steps", []))
        return httpx.Response(200, json={})

    def steps(self) -> list[int]:
        return [p["step"] for batch in self.batches for p in batch]


def make_reporter(tmp_path: Path, server: FakeServer, **options: Any) -> tuple[HttpReporter, Callable[..., None]]:
    client = ServerClient("http://hpo", transport=httpx.MockTransport(server.handle), backoff=FAST)
    path = tmp_path / "metrics.jsonl"
    reporter = HttpReporter(client, 1, "lease", path, tmp_path, **options)

    def write(step: int, partial: bool = False) -> None:
        with path.open("a") as log:
            log.write(json.dumps({"step": step, "name": "train/loss", "value": 1.0 / step}) + ("" if partial else "\n"))
        if not partial:
            reporter.metrics(step, {"train/loss": 1.0 / step})

    return reporter, write


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_tail_reads_whole_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "name": "a", "value": NaN}\n{"step": 2, "na')
    tail = MetricsTail(path)
    points, end = tail.read()
    assert len(points) == 1 and math.isnan(points[0]["value"]) and end == path.read_text().index("\n") + 1
    tail.advance(end)
    assert tail.read() == ([], end)


def test_reporter_flushes_by_count(tmp_path: Path) -> None:
    """Every 10 points reported make a flush of all the file holds, so with flushes by time a
    minute apart at most 9 of 25 points wait (a flush may read more than the 10 that woke it, and
    then fewer than 10 are left: 20 was not a bound)."""
    server = FakeServer()
    reporter, write = make_reporter(tmp_path, server, flush_points=10, flush_seconds=60)
    reporter.start()
    for step in range(1, 26):
        write(step)
    wait_for(lambda: len(server.steps()) >= 25 - 9)
    assert server.steps() == list(range(1, len(server.steps()) + 1))
    assert not reporter.close()
    assert server.steps() == list(range(1, 26))


def test_reporter_flushes_by_time(tmp_path: Path) -> None:
    server = FakeServer()
    reporter, write = make_reporter(tmp_path, server, flush_points=1000, flush_seconds=0.1)
    reporter.start()
    write(1)
    wait_for(lambda: server.steps() == [1])
    reporter.close()


def test_outage_buffers_on_disk_in_bounded_batches_then_delivers_everything(tmp_path: Path) -> None:
    server = FakeServer()
    server.down = True
    reporter, write = make_reporter(tmp_path, server, flush_points=5, flush_seconds=0.05, max_batch=7)
    reporter.start()
    for step in range(1, 51):
        write(step)
    time.sleep(0.3)
    assert reporter.should_stop() is False  # an outage never stops training
    server.down = False
    wait_for(lambda: len(server.steps()) == 50)
    assert server.steps() == list(range(1, 51))
    assert max(len(batch) for batch in server.batches) <= 7
    reporter.close()


def test_checkpoint_is_recorded_only_after_the_points_it_covers(tmp_path: Path) -> None:
    server = FakeServer()
    reporter, write = make_reporter(tmp_path, server, flush_points=1, flush_seconds=0.05)
    reporter.start()
    for step in range(1, 11):
        write(step)
    reporter.checkpoint(10, tmp_path / "trials" / "1" / "ckpt-10", 0.5)
    time.sleep(0.3)
    assert ("checkpoint", 10) not in server.events  # no point above step 10 delivered yet
    write(11)
    wait_for(lambda: ("checkpoint", 10) in server.events)
    position = server.events.index(("checkpoint", 10))
    assert max(step for kind, step in server.events[:position] if kind == "points") >= 10
    reporter.close()


def test_retention_deletes_drop_unsent_records_and_travel_with_the_next_one(tmp_path: Path) -> None:
    server = FakeServer()
    reporter, write = make_reporter(tmp_path, server, flush_points=1, flush_seconds=0.05)
    reporter.start()
    write(5)
    reporter.checkpoint(5, tmp_path / "trials" / "1" / "ckpt-5", 0.5)
    write(6)
    wait_for(lambda: ("checkpoint", 5) in server.events)
    reporter.checkpoint(10, tmp_path / "trials" / "1" / "ckpt-10", 0.6)
    reporter.checkpoints_deleted([5, 10])  # 10 was never sent: it is dropped; 5 was: the server is told
    reporter.checkpoint(20, tmp_path / "trials" / "1" / "ckpt-20", 0.4)
    write(21)
    wait_for(lambda: ("checkpoint", 20) in server.events)
    assert ("checkpoint", 10) not in server.events and sorted(server.deleted) == [5, 10]
    reporter.close()


def test_close_returns_what_the_server_did_not_take(tmp_path: Path) -> None:
    server = FakeServer()
    reporter, write = make_reporter(tmp_path, server, flush_points=1000, flush_seconds=60)
    reporter.start()
    write(1)
    write(2)
    write(3, partial=True)  # a line cut by a crash is not a point
    reporter.checkpoint(2, tmp_path / "ckpt", None)
    server.down = True
    left = reporter.close(deliver_for=0.05)
    assert [p["step"] for p in left.points] == [1, 2]
    assert left.checkpoints == [(2, "ckpt", None)]


def test_lost_lease_stops_the_run_and_drops_everything(tmp_path: Path) -> None:
    server = FakeServer()
    server.lease_lost = True
    stop_flag = {"stop": False}
    reporter, write = make_reporter(
        tmp_path, server, flush_points=1, flush_seconds=0.05, stop_requested=lambda: stop_flag["stop"]
    )
    reporter.start()
    write(1)
    wait_for(reporter.should_stop)
    assert not reporter.close()


def test_stop_request_from_the_driver_reaches_should_stop(tmp_path: Path) -> None:
    flag = {"stop": False}
    reporter, _ = make_reporter(tmp_path, FakeServer(), stop_requested=lambda: flag["stop"])
    assert reporter.should_stop() is False
    flag["stop"] = True
    assert reporter.should_stop() is True


def test_failure_reasons_are_plain_text_with_the_exception_first() -> None:
    from hpo.worker.disk import names_the_disk
    from hpo.worker.runner import plain_reason

    ray_style = (
        "RayTaskError(OSError): \x1b[36mray::_trial_process()\x1b[39m (pid=12, ip=10.0.0.1)\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 3, in f\n'
        "    handle.write(data)\n"
        "OSError: [Errno 28] No space left on device\n"
    )
    reason = plain_reason(ray_style)
    assert "\x1b" not in reason
    assert reason.splitlines()[0] == "OSError: [Errno 28] No space left on device"
    assert names_the_disk(reason) and not names_the_disk("ValueError: lr must be positive")
    assert plain_reason("the command exited with status 1") == "the command exited with status 1"
