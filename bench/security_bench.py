"""What the security layer costs per request: the same calls against `hpo server` without tokens
(open, the laptop case) and with tokens (every call authenticated, bodies checked for NUL and
surrogates either way).

Measures, sequentially over one keep-alive connection:
  - an empty claim (204): the smallest authenticated write, `--calls` times;
  - a 5,000-point metrics batch posted with the trial token, `--batches` times.

and, in process (free of HTTP and scheduling noise), the per-request cost of the credentials
middleware with a cached token and of the hostile-input scan of a 5,000-point batch.

Usage: python bench/security_bench.py [--database sqlite|postgres] [--calls 2000] [--batches 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.conftest import free_port  # noqa: E402


def start(database_url: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HPO_DATABASE_URL": database_url}
    env.pop("HPO_API_TOKEN", None)
    command = [sys.executable, "-m", "hpo.cli", "server", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.2)


def measure(url: str, worker: dict[str, str], writer: dict[str, str], calls: int, batches: int) -> dict[str, float]:
    with httpx.Client(base_url=url, timeout=60) as http:
        spec = {"name": f"bench-{time.time_ns()}", "hyperparameters": [{"name": "x", "role": "fixed", "value": 1}]}
        assert http.post("/api/v1/studies", json=spec, headers=writer).status_code == 201
        claim = http.post("/api/v1/workers/claim", json={"worker_id": "b"}, headers=worker).json()
        trial = {"Authorization": f"Bearer {claim['trial_token']}"} if claim.get("trial_token") else {}
        latencies = []
        for _ in range(calls):
            start = time.perf_counter()
            response = http.post("/api/v1/workers/claim", json={"worker_id": "b"}, headers=worker)
            latencies.append(time.perf_counter() - start)
            assert response.status_code == 204, response.text
        batch_times = []
        for b in range(batches):
            points = [{"step": b * 5000 + i, "name": "train/loss", "value": 0.5} for i in range(5000)]
            body = {"lease_id": claim["lease_id"], "points": points}
            start = time.perf_counter()
            response = http.post(f"/api/v1/trials/{claim['trial_id']}/metrics", json=body, headers=trial)
            batch_times.append(time.perf_counter() - start)
            assert response.status_code == 200, response.text
    latencies.sort()
    return {
        "claim_p50_ms": 1000 * statistics.median(latencies),
        "claim_p99_ms": 1000 * latencies[int(0.99 * len(latencies))],
        "claims_per_s": len(latencies) / sum(latencies),
        "batch_p50_ms": 1000 * statistics.median(batch_times),
    }


def micro() -> None:
    import asyncio
    import json
    import timeit

    from hpo.server.api.guards.body import bad_escape
    from hpo.server.api.guards.credentials import Auth
    from hpo.server.auth import tokens as auth
    from hpo.server.db import Database

    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"sqlite:///{tmp}/micro.db")
        db.upgrade()
        token = auth.create_token(db, "worker")[1]
        authenticator = auth.Authenticator(db, None, None)
        authenticator.enabled()
        authenticator.principal(token)

        async def app(scope: object, receive: object, send: object) -> None:
            return None

        middleware = Auth(app, authenticator)
        headers = [(b"authorization", f"Bearer {token}".encode()), (b"content-type", b"application/json")]
        scope = {"type": "http", "method": "POST", "path": "/api/v1/workers/claim", "headers": headers}
        n = 20_000

        async def run() -> None:
            for _ in range(n):
                await middleware(scope, None, None)  # type: ignore[arg-type]

        start = time.perf_counter()
        asyncio.run(run())
        per_request = (time.perf_counter() - start) / n
        db.dispose()
    points = [{"step": i, "name": "train/loss", "value": 0.5} for i in range(5000)]
    body = json.dumps({"lease_id": "x" * 36, "points": points}).encode()
    scan = timeit.timeit(lambda: bad_escape(body), number=500) / 500
    parse = timeit.timeit(lambda: json.loads(body), number=20) / 20
    print(f"in process: auth middleware {per_request * 1e6:.1f} us a request (cached token); hostile-input scan")
    print(f"of a 5,000-point batch ({len(body):,} bytes) {scan * 1e6:.1f} us (json.loads of it: {parse * 1e6:.0f} us)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args()
    micro()
    from hpo.server.auth import tokens as auth
    from hpo.server.db import Database

    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for mode in ("open", "tokens"):
            if args.database == "sqlite":
                url = f"sqlite:///{tmp}/{mode}.db"
            else:
                from bench.server_bench import fresh_database

                url = fresh_database(args.postgres, f"hpo_security_bench_{mode}")
            worker: dict[str, str] = {}
            writer: dict[str, str] = {}
            if mode == "tokens":
                db = Database(url)
                db.upgrade()
                worker = {"Authorization": f"Bearer {auth.create_token(db, 'worker')[1]}"}
                writer = {"Authorization": f"Bearer {auth.create_token(db, 'write')[1]}"}
                db.dispose()
            port = free_port()
            server = start(url, port)
            try:
                rows[mode] = measure(f"http://127.0.0.1:{port}", worker, writer, args.calls, args.batches)
            finally:
                server.terminate()
                server.wait(30)
    print(f"{args.database}: {args.calls} empty claims, {args.batches} batches of 5,000 points, one connection")
    print(f"{'':8}{'claims/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'5k batch p50 ms':>17}")
    for mode, r in rows.items():
        print(
            f"{mode:8}{r['claims_per_s']:>10.0f}{r['claim_p50_ms']:>9.2f}{r['claim_p99_ms']:>9.2f}"
            f"{r['batch_p50_ms']:>17.1f}"
        )


if __name__ == "__main__":
    main()
