"""HTTP client for the worker protocol (docs/worker-protocol.md).

Errors fall in three kinds, because a worker reacts to each differently:
- `LeaseLost` (409): the lease is not ours any more; stop that run at once and write nothing more.
- `ServerUnavailable`: no answer, or 5xx/429, within the retry budget; keep training and retry later.
- `ProtocolError`: any other refusal (4xx); a retry would get the same answer.

Transient failures are retried with exponential backoff and jitter for up to `retry_for` seconds
(0: one try). Every worker write is idempotent on the server (metrics upsert on (trial, name,
step); a repeated complete/fail answers 409), so a retried request that had in fact arrived does no
harm.

Several servers (`base_url` "http://a:8000,http://b:8000", servers sharing one Postgres): each
client starts at a random one (a fleet spreads over them) and moves to the next as soon as one
fails transiently, before any backoff; only when every server failed in a row does it wait. Leases
live in the database, so any server takes any write of any lease."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from hpo.trainer.result import json_float  # non-finite numbers travel as strings (docs/api.md, "Conventions")

API = "/api/v1"


class ProtocolError(Exception):
    """The server refused a request for a reason a retry will not fix."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class LeaseLost(ProtocolError):
    """409: the lease expired, was taken by another worker, or the trial finished or was cancelled."""


class ServerUnavailable(Exception):
    """The server did not answer usefully within the retry budget (connection error, timeout, 5xx, 429)."""


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter on a fraction of each delay, so many workers that lost
    the server together do not come back in lockstep."""

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 30.0
    jitter: float = 0.25

    def delays(self) -> Iterator[float]:
        delay = self.initial
        while True:
            yield delay * (1 - self.jitter * random.random())
            delay = min(self.maximum, delay * self.factor)


class ServerClient:
    """Connection pools to the hpo server, or to several (comma-separated URLs). Thread-safe
    (httpx.Client is); picklable by construction arguments, so Ray tasks rebuild it on their own
    node."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout: float = 10.0,
        backoff: Backoff | None = None,
        transport: httpx.BaseTransport | None = None,
        start: int | None = None,
    ) -> None:
        """`start`: the index of the first server to use (default a random one)."""
        self.urls = tuple(url.strip().rstrip("/") for url in base_url.split(",") if url.strip())
        if not self.urls:
            raise ValueError("no server URL given")
        self.token = token
        self.timeout = timeout
        self.backoff = backoff or Backoff()
        self._transport = transport
        self._clients: dict[str, httpx.Client] = {}
        # Spread a fleet over the servers.
        self._current = random.randrange(len(self.urls)) if start is None else start % len(self.urls)
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        """The server this client talks to now."""
        return self.urls[self._current % len(self.urls)]

    @property
    def _http(self) -> httpx.Client:
        # Built on first use: an httpx.Client costs ~20 ms (its TLS context), paid once per
        # process that talks, not for each job the driver builds.
        url = self.base_url
        client = self._clients.get(url)
        if client is None:
            with self._lock:
                client = self._clients.get(url)
                if client is None:
                    headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
                    client = httpx.Client(
                        base_url=url, timeout=self.timeout, headers=headers, transport=self._transport
                    )
                    self._clients[url] = client
        return client

    def _fail_over(self, failed: str) -> None:
        """The next server, unless another thread moved on already."""
        with self._lock:
            if self.base_url == failed:
                self._current = (self._current + 1) % len(self.urls)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ServerClient, (",".join(self.urls), self.token, self.timeout, self.backoff))

    def for_trial(self, trial_token: str | None) -> ServerClient:
        """The client a trial process gets: the server's per-trial token (or none), never this
        client's own token, which may claim trials and so must stay with the driver."""
        return ServerClient(",".join(self.urls), trial_token, self.timeout, self.backoff)

    def close(self) -> None:
        for client in list(self._clients.values()):
            client.close()

    # -- the protocol -------------------------------------------------------------------------

    def claim(
        self,
        worker_id: str,
        cpus: float,
        gpus: float,
        capabilities: dict[str, Any] | None = None,
        retry_for: float = 0,
    ) -> dict[str, Any] | None:
        """Leases the next pending trial whose footprint fits `cpus`/`gpus`, and, given this worker's
        `capabilities` (hpo.policy.ExecutionPolicy.capabilities), that it would run; None when none
        fits (204)."""
        body: dict[str, Any] = {"worker_id": worker_id, "resources": {"cpus": cpus, "gpus": gpus}}
        if capabilities is not None:
            body["capabilities"] = capabilities
        response = self.request("POST", f"{API}/workers/claim", body, retry_for)
        return None if response.status_code == 204 else response.json()

    def heartbeat(self, trial_id: int, lease_id: str, retry_for: float = 0) -> dict[str, Any]:
        """Extends the lease: `{lease_expires_at, should_stop}`. `LeaseLost` when it is not ours."""
        return self.request("POST", f"{API}/trials/{trial_id}/heartbeat", {"lease_id": lease_id}, retry_for).json()

    def post_metrics(
        self, trial_id: int, lease_id: str, points: list[dict[str, Any]], retry_for: float = 0
    ) -> dict[str, Any]:
        """Upserts `[{step, name, value}]`; replaying a batch duplicates nothing."""
        body = {"lease_id": lease_id, "points": [{**p, "value": json_float(float(p["value"]))} for p in points]}
        return self.request("POST", f"{API}/trials/{trial_id}/metrics", body, retry_for).json()

    def post_checkpoint(
        self,
        trial_id: int,
        lease_id: str,
        step: int,
        uri: str,
        objective: float | None,
        retry_for: float = 0,
        deleted: list[int] | None = None,
    ) -> None:
        """Records a checkpoint the next attempt may resume from, and forgets the records of the
        `deleted` steps (files retention removed)."""
        value = None if objective is None else json_float(float(objective))
        body: dict[str, Any] = {"lease_id": lease_id, "step": step, "uri": uri, "objective": value}
        if deleted:
            body["deleted_steps"] = deleted
        self.request("POST", f"{API}/trials/{trial_id}/checkpoints", body, retry_for)

    def complete(
        self, trial_id: int, lease_id: str, retry_for: float = 0, unread_params: list[str] | None = None
    ) -> None:
        """Ends the attempt as completed; `unread_params` names the hyperparameters that never
        reached the script (None: unknown)."""
        body: dict[str, Any] = {"lease_id": lease_id}
        if unread_params is not None:
            body["unread_params"] = unread_params
        self.request("POST", f"{API}/trials/{trial_id}/complete", body, retry_for)

    def fail(
        self,
        trial_id: int,
        lease_id: str,
        kind: str,
        reason: str,
        step: int | None = None,
        retry_for: float = 0,
        unread_params: list[str] | None = None,
    ) -> str:
        """Ends the attempt as `infeasible | error | preempted | config`, or `returned` (the worker
        could not run it: undone as if never claimed); answers the trial's new status."""
        body: dict[str, Any] = {"lease_id": lease_id, "kind": kind, "reason": reason[-20_000:], "step": step}
        if unread_params is not None:
            body["unread_params"] = unread_params
        return str(self.request("POST", f"{API}/trials/{trial_id}/fail", body, retry_for).json()["status"])

    def report_health(self, worker_id: str, healthy: bool, reason: str = "") -> None:
        """Tells the server whether this worker can run trials (docs/workers.md, "Worker health")."""
        body = {"worker_id": worker_id, "healthy": healthy, "reason": reason[:2000]}
        self.request("POST", f"{API}/workers/health", body, 0)

    # -- plumbing -----------------------------------------------------------------------------

    def get(self, path: str, params: dict[str, Any] | None = None, retry_for: float = 0) -> Any:
        return self.request("GET", path, None, retry_for, params=params).json()

    def post(self, path: str, body: Any, retry_for: float = 0) -> Any:
        return self.request("POST", path, body, retry_for).json()

    def request(
        self, method: str, path: str, body: Any, retry_for: float = 0, params: dict[str, Any] | None = None
    ) -> httpx.Response:
        """Sends one request, retrying transient failures for up to `retry_for` seconds."""
        deadline = time.monotonic() + retry_for
        delays = self.backoff.delays()
        failed_in_a_row = 0
        while True:
            url = self.base_url
            try:
                return self._once(method, path, body, params)
            except ServerUnavailable:
                failed_in_a_row += 1
                if len(self.urls) > 1:
                    self._fail_over(url)
                    if failed_in_a_row % len(self.urls):  # another server not tried yet: at once
                        continue
                delay = next(delays)
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)

    def _once(self, method: str, path: str, body: Any, params: dict[str, Any] | None) -> httpx.Response:
        try:
            response = self._http.request(method, path, json=body, params=params)
        except httpx.TransportError as exc:
            raise ServerUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 409:
            raise LeaseLost(_detail(response), 409)
        if response.status_code == 429 or response.status_code >= 500:
            raise ServerUnavailable(f"{method} {path}: HTTP {response.status_code}: {_detail(response)}")
        if response.status_code >= 400:
            message = f"{method} {path}: HTTP {response.status_code}: {_detail(response)}"
            raise ProtocolError(message, response.status_code)
        return response


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))
    except (ValueError, AttributeError):
        return response.text[:500]
