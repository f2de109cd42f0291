"""Study-service benchmark on Postgres, side by side with Optuna as the reference.

Measures, in one run on this machine:
  - study creation: one POST of a 10,000-trial study;
  - trial dispatch: claims/s over HTTP with 16 concurrent worker processes, p50/p99 latency, and
    duplicated points among the claimed trials;
  - metric ingest: points/s through the batch endpoint with 4 concurrent reporter processes;
  - Optuna 5 (RDBStorage on the same Postgres, QMCSampler halton+scramble, same 4-parameter space):
    ask+tell cycles/s with 16 processes, p99 ask, duplicated points; trial.report points/s with 4.

Usage: python bench/server_bench.py [--postgres postgresql+psycopg://postgres@127.0.0.1:5432]
       [--server-workers 2] [--no-optuna]
Needs the `bench` extra (optuna) for the reference half.
"""

from __future__ import annotations

import argparse
import atexit
import http.client
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
from sqlalchemy import create_engine, text

SPACE = [
    {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"},
    {"name": "weight_decay", "role": "nuisance", "type": "float", "min": 1e-6, "max": 1e-2, "scale": "log"},
    {"name": "momentum", "role": "nuisance", "type": "float", "min": 0.8, "max": 0.999, "scale": "reverse_log"},
    {"name": "dropout", "role": "nuisance", "type": "float", "min": 0.0, "max": 0.5},
]


def fresh_database(admin_url: str, prefix: str) -> str:
    """A new database with a random name, so two benches can share one Postgres; dropped at exit."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    engine = create_engine(f"{admin_url}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    atexit.register(_drop_database, admin_url, name)
    return f"{admin_url}/{name}"


def _drop_database(admin_url: str, name: str) -> None:
    engine = create_engine(f"{admin_url}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def start_server(database_url: str, port: int, workers: int) -> subprocess.Popen[bytes]:
    # Claimed trials are never completed here: a long lease keeps the reaper from handing them out
    # again mid-run, which would count as (legitimate) repeat claims.
    env = {**os.environ, "HPO_DATABASE_URL": database_url, "HPO_LEASE_SECONDS": "3600"}
    command = [
        sys.executable,
        "-m",
        "hpo.cli",
        "server",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--log-level",
        "warning",
    ]
    process = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("server did not start")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_parallel(target: Callable[..., Any], args_list: list[tuple[Any, ...]]) -> tuple[list[Any], float]:
    """Runs target(*args, barrier, queue) in processes started together; answers results, wall s."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(len(args_list) + 1), ctx.Queue()
    processes = [ctx.Process(target=target, args=(*args, barrier, queue)) for args in args_list]
    for process in processes:
        process.start()
    barrier.wait()
    start = time.perf_counter()
    results = [queue.get() for _ in processes]
    wall = time.perf_counter() - start
    for process in processes:
        process.join()
    return results, wall


class JsonClient:
    """A keep-alive HTTP/1.1 client on the standard library. The load generators share the two
    cores with the server, and httpx costs several times more CPU per request (on this machine 16
    httpx processes top out near 800 GET /healthz per second, stdlib ones near 2,100), so with it
    the benchmark would mostly measure its own clients. `--httpx` uses httpx anyway."""

    def __init__(self, url: str, use_httpx: bool) -> None:
        self.url, self.use_httpx = url, use_httpx
        if use_httpx:
            self.httpx = httpx.Client(base_url=url, timeout=60)
        else:
            host, port = url.split("//")[1].split(":")
            self.conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        if self.use_httpx:
            response = self.httpx.post(path, json=body)
            return response.status_code, response.json() if response.content else None
        self.conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        response = self.conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None


def claimer(url: str, worker: int, use_httpx: bool, barrier: Any, queue: Any) -> None:
    latencies, claimed = [], []
    client = JsonClient(url, use_httpx)
    barrier.wait()
    while True:
        started = time.perf_counter()
        code, body = client.post("/api/v1/workers/claim", {"worker_id": f"w{worker}", "resources": {"cpus": 8}})
        latencies.append(time.perf_counter() - started)
        if code != 200:
            break
        claimed.append((body["trial_id"], tuple(sorted(body["config"]["params"].items()))))
    queue.put((latencies, claimed))


def reporter(
    url: str, trial_id: int, lease_id: str, batches: int, batch_size: int, use_httpx: bool, barrier: Any, queue: Any
) -> None:
    client = JsonClient(url, use_httpx)
    payloads = []
    for b in range(batches):
        points = [{"step": b * batch_size + i, "name": "train/loss", "value": 1.0 / (1 + i)} for i in range(batch_size)]
        payloads.append({"lease_id": lease_id, "points": points})
    barrier.wait()
    sent = 0
    for payload in payloads:
        code, body = client.post(f"/api/v1/trials/{trial_id}/metrics", payload)
        if code != 200:
            raise SystemExit(f"metrics refused: {code} {body}")
        sent += len(payload["points"])
    queue.put(sent)


def bench_hpo(url: str, claimers: int, reporters: int, use_httpx: bool) -> dict[str, float]:
    http = httpx.Client(base_url=url, timeout=120)
    started = time.perf_counter()
    created = http.post("/api/v1/studies", json={"name": "dispatch", "num_trials": 10_000, "hyperparameters": SPACE})
    creation_s = time.perf_counter() - started
    created.raise_for_status()
    results, wall = run_parallel(claimer, [(url, i, use_httpx) for i in range(claimers)])
    latencies = [lat for lats, _ in results for lat in lats]
    claimed = [c for _, cs in results for c in cs]
    ids = Counter(trial_id for trial_id, _ in claimed)
    points = Counter(params for _, params in claimed)
    http.post("/api/v1/studies", json={"name": "ingest", "num_trials": reporters, "hyperparameters": SPACE})
    leases = [
        http.post("/api/v1/workers/claim", json={"worker_id": "r", "resources": {"cpus": 8}}).json()
        for _ in range(reporters)
    ]
    jobs = [(url, c["trial_id"], c["lease_id"], 25, 2000, use_httpx) for c in leases]
    sent, ingest_wall = run_parallel(reporter, jobs)
    return {
        "create_10000_trials_s": creation_s,
        "claims": len(claimed),
        "claims_per_s": len(claimed) / wall,
        "claim_p50_ms": 1000 * percentile(latencies, 0.50),
        "claim_p99_ms": 1000 * percentile(latencies, 0.99),
        "trials_claimed_twice": sum(1 for n in ids.values() if n > 1),
        "duplicated_points": sum(n - 1 for n in points.values() if n > 1),
        "ingest_points_per_s": sum(sent) / ingest_wall,
    }


def optuna_asker(storage_url: str, cycles: int, barrier: Any, queue: Any) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(storage_url)
    sampler = optuna.samplers.QMCSampler(qmc_type="halton", scramble=True, seed=0, warn_independent_sampling=False)
    study = optuna.load_study(study_name="ref", storage=storage, sampler=sampler)
    barrier.wait()
    asks, points = [], []
    for _ in range(cycles):
        started = time.perf_counter()
        trial = study.ask()
        params = (
            trial.suggest_float("learning_rate", 1e-4, 1.0, log=True),
            trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
            trial.suggest_float("one_minus_momentum", 1e-3, 0.2, log=True),
            trial.suggest_float("dropout", 0.0, 0.5),
        )
        asks.append(time.perf_counter() - started)
        study.tell(trial, 0.0)
        points.append(params)
    queue.put((asks, points))


def optuna_reporter(storage_url: str, steps: int, barrier: Any, queue: Any) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="ref", storage=optuna.storages.RDBStorage(storage_url))
    trial = study.ask()
    barrier.wait()
    for step in range(steps):
        trial.report(1.0 / (1 + step), step)
    queue.put(steps)


def bench_optuna(storage_url: str, workers: int, reporters: int) -> dict[str, float]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="ref", storage=optuna.storages.RDBStorage(storage_url))
    results, wall = run_parallel(optuna_asker, [(storage_url, 400 // workers) for _ in range(workers)])
    asks = [a for lats, _ in results for a in lats]
    points = Counter(p for _, ps in results for p in ps)
    reported, report_wall = run_parallel(optuna_reporter, [(storage_url, 500) for _ in range(reporters)])
    return {
        "ask_tell_per_s": len(asks) / wall,
        "ask_p99_ms": 1000 * percentile(asks, 0.99),
        "duplicated_points": sum(n - 1 for n in points.values() if n > 1),
        "report_points_per_s": sum(reported) / report_wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432")
    parser.add_argument("--server-workers", type=int, default=2)
    parser.add_argument("--claimers", type=int, default=16)
    parser.add_argument("--reporters", type=int, default=4)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--no-optuna", action="store_true")
    parser.add_argument("--httpx", action="store_true", help="load generators use httpx instead of http.client")
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    server = start_server(fresh_database(args.postgres, "hpo_bench"), args.port, args.server_workers)
    try:
        figures = bench_hpo(url, args.claimers, args.reporters, args.httpx)
    finally:
        server.terminate()
        server.wait(timeout=30)
    client = "httpx" if args.httpx else "http.client"
    print(f"hpo (Postgres, {args.server_workers} server processes, {os.cpu_count()} cores, {client} load generators)")
    for key, value in figures.items():
        print(f"  {key:28s} {value:12.2f}")
    if not args.no_optuna:
        reference = bench_optuna(fresh_database(args.postgres, "optuna_bench"), args.claimers, args.reporters)
        print(f"optuna {__import__('optuna').__version__} (RDBStorage on the same Postgres, QMCSampler halton)")
        for key, value in reference.items():
            print(f"  {key:28s} {value:12.2f}")
        print(f"  dispatch speed-up vs ask+tell {figures['claims_per_s'] / reference['ask_tell_per_s']:12.1f}x")
        ingest_ratio = figures["ingest_points_per_s"] / reference["report_points_per_s"]
        print(f"  ingest speed-up vs report     {ingest_ratio:12.1f}x")


if __name__ == "__main__":
    main()
