"""A database that dies in the middle of a request: a real `hpo server` on Postgres behind a TCP
relay, the relay cut at random moments of a read, a write, a claim and a metrics batch. Every
answer is the request's own success (it finished before the cut) or a 503, never a 500; each 503
is one line in the server's log and the log holds no traceback (a rollback or close on the dead
connection fails too, and that second error must not escape: docs/workers.md, "Database outages")."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.system import test_outage
from tests.system.test_outage import Relay, _server, _wait_for

relayed = test_outage.relayed  # the fixture: Postgres behind a relay that can be cut

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(150)]

ROUNDS = 8  # cuts per kind of request (a claim pool that lost its connections takes seconds to refill)
SPEC = {
    "num_trials": 400,
    "objective": {"metric": "valid/loss", "mode": "min"},
    "hyperparameters": [{"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-3, "max": 1.0}],
}
OK = {200, 201, 204}


class Answers:
    """Every answer the test gets from the server, by status."""

    def __init__(self, base: str) -> None:
        self.base, self.statuses = base, Counter[int]()
        self.lock = threading.Lock()

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        answer = httpx.request(method, f"{self.base}{path}", timeout=30, **kwargs)
        with self.lock:
            self.statuses[answer.status_code] += 1
        return answer


def test_cutting_the_database_mid_request_is_a_503_never_a_500(relayed: tuple[Relay, str], tmp_path: Path) -> None:
    relay, url = relayed
    server, base, log = _server(url, tmp_path)
    answers = Answers(base)
    try:
        _wait_for(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, "the server")
        study = answers.call("POST", "/api/v1/studies", json={**SPEC, "name": "held"})
        assert study.status_code == 201, study.text
        study_id = study.json()["id"]
        held = answers.call("POST", "/api/v1/workers/claim", json={"worker_id": "w", "resources": {"cpus": 1}})
        assert held.status_code == 200, held.text
        lease = held.json()
        points = [{"step": s, "name": "valid/loss", "value": 1.0 / (1 + s)} for s in range(5_000)]
        names = iter(range(10**6))
        requests: dict[str, Any] = {
            "read": lambda: answers.call("GET", f"/api/v1/studies/{study_id}/trials", params={"limit": 400}),
            "write": lambda: answers.call("POST", "/api/v1/studies", json={**SPEC, "name": f"s{next(names)}"}),
            "claim": lambda: answers.call(
                "POST", "/api/v1/workers/claim", json={"worker_id": "w", "resources": {"cpus": 1}}
            ),
            "metrics": lambda: answers.call(
                "POST",
                f"/api/v1/trials/{lease['trial_id']}/metrics",
                json={"lease_id": lease["lease_id"], "points": points},
            ),
        }
        # How long each takes undisturbed: the cuts land anywhere from its start to past its end.
        spans = {}
        for kind, request in requests.items():
            took = []
            for _ in range(3):
                start = time.monotonic()
                assert request().status_code in OK, kind
                took.append(time.monotonic() - start)
            spans[kind] = 1.3 * statistics.median(took)
        before = len(log.read_text().splitlines())
        rng = random.Random(37)
        outcomes: Counter[tuple[str, int]] = Counter()
        for _ in range(ROUNDS):
            for kind, request in requests.items():
                box: list[int] = []
                worker = threading.Thread(target=lambda r=request, b=box: b.append(r().status_code))
                worker.start()
                time.sleep(rng.uniform(0, spans[kind]))
                relay.cut()
                worker.join(30)
                assert box, f"the {kind} got no answer"
                outcomes[kind, box[0]] += 1
                relay.start()
                # Served again (a connection the cut killed is found dead and dropped), on both
                # pools: the routes' and the direct path's of claims.
                _wait_for(lambda: answers.call("GET", f"/api/v1/studies/{study_id}").status_code == 200, "recovery")
                _wait_for(lambda: requests["claim"]().status_code in OK, "claims")
        time.sleep(1.5)  # the log lines of the last requests land
        during = log.read_text().splitlines()[before:]
        print(f"spans {spans}; outcomes {sorted(outcomes.items())}; all answers {dict(answers.statuses)}")
        assert set(answers.statuses) <= OK | {503}, (answers.statuses, outcomes)
        for kind in requests:  # each kind was cut in flight at least once
            assert outcomes[kind, 503] >= 1, (kind, outcomes)
        assert not [line for line in during if "Traceback" in line], "\n".join(during)
        background = ("bayesian refill: ", "lease reaper: ", "curve statistics keeper: ")
        pool = (
            "error connecting in 'pool-",
            "Is the server running",
            "discarding closed connection",
        )  # psycopg's pool, reconnecting
        expected = ("storage error: ", '"GET /', '"POST /', *background, *pool)
        assert all(any(mark in line for mark in expected) for line in during), "\n".join(during)
        # One line a 503 (plus uvicorn's access line), counting the recovery probes' 503s too.
        storage_lines = [line for line in during if "storage error: " in line]
        assert len(storage_lines) == answers.statuses[503], (len(storage_lines), answers.statuses)
    finally:
        server.terminate()
        server.wait(30)
