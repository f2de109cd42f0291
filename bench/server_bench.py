"""Study-service benchmark on Postgres, side by side with Optuna as the reference.

Measures, in one run on this machine:
  - study creation: one POST of a 10,000-trial study;
  - trial dispatch: claims/s over HTTP with 16 concurrent worker processes, p50/p99 latency, and
    duplicated points among the claimed trials;
  - metric ingest: points/s through the batch endpoint with 4 concurrent reporter processes;
  - Optuna 5 (RDBStorage on the same Postgres, QMCSampler halton+scramble, same 4-parameter space):
    ask+tell cycles/s with 16 processes, p99 ask, duplicated points; trial.report points/s with 4.

It also prints the CPU time the server processes and the database's backends spent per claim and
per point (from /proc, Postgres on this machine): on a shared machine those vary far less than the
rates, and `*_capacity_per_core` (1 / (server + database CPU per operation)) is what one core would
serve with the load generators elsewhere.

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
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

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


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (those that exited count nothing)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


def process_tree(root: int) -> list[int]:
    """`root` and its descendants (the server's worker and model-fitting processes)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            parents.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, []))
    return tree


class CpuMeter:
    """CPU seconds spent by the server's processes and by the Postgres backends serving its
    database, between `start()` and `stop()` (pool connections stay open across a phase)."""

    def __init__(self, server_pid: int, database_url: str) -> None:
        self.server_pid, self.database_url = server_pid, database_url
        self.engine = create_engine(database_url, poolclass=NullPool)

    def _backends(self) -> list[int]:
        """The backends' pids; [] when Postgres keeps refusing a connection (max_connections
        reached by the load: then only the backends seen at `start()` are measured)."""
        query = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        for _ in range(10):
            try:
                with self.engine.connect() as conn:
                    return [int(row[0]) for row in conn.execute(text(query))]
            except OperationalError:
                time.sleep(0.5)
        return []

    def sample(self) -> tuple[float, float, list[int]]:
        backends = self._backends()
        return cpu_seconds(process_tree(self.server_pid)), cpu_seconds(backends), backends

    def start(self) -> None:
        self.server0, self.db0, self.backends0 = self.sample()

    def stop(self) -> tuple[float, float]:
        """(server CPU s, database CPU s) since start(); backends that came later start at 0."""
        server, _, backends = self.sample()
        return server - self.server0, cpu_seconds(sorted(set(backends) | set(self.backends0))) - self.db0

    def settle(self, limit: float = 30.0) -> None:
        """Waits until the server's start-up work (its warm-up imports) is done, so it does not
        count against the first phase."""
        deadline, last = time.monotonic() + limit, cpu_seconds(process_tree(self.server_pid))
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = cpu_seconds(process_tree(self.server_pid))
            if now - last < 0.05:
                return
            last = now


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
        return self.post_encoded(path, json.dumps(body).encode())

    def post_encoded(self, path: str, body: bytes) -> tuple[int, Any]:
        """POST a body already encoded as JSON."""
        headers = {"content-type": "application/json"}
        if self.use_httpx:
            response = self.httpx.post(path, content=body, headers=headers)
            return response.status_code, response.json() if response.content else None
        self.conn.request("POST", path, body, headers)
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
    # Encoded before the clock starts, as the claims' bodies are small: json.dumps of a 2,000-point
    # batch is 1-1.6 us a point of the load generator's CPU, on the cores the server and Postgres
    # share here (a fleet's workers encode on their own machines).
    payloads = []
    for b in range(batches):
        points = [{"step": b * batch_size + i, "name": "train/loss", "value": 1.0 / (1 + i)} for i in range(batch_size)]
        payloads.append(json.dumps({"lease_id": lease_id, "points": points}).encode())
    barrier.wait()
    for payload in payloads:
        code, body = client.post_encoded(f"/api/v1/trials/{trial_id}/metrics", payload)
        if code != 200:
            raise SystemExit(f"metrics refused: {code} {body}")
    queue.put(batches * batch_size)


def bench_hpo(
    url: str, claimers: int, reporters: int, batches: int, use_httpx: bool, meter: CpuMeter
) -> dict[str, float]:
    http = httpx.Client(base_url=url, timeout=120)
    started = time.perf_counter()
    created = http.post("/api/v1/studies", json={"name": "dispatch", "num_trials": 10_000, "hyperparameters": SPACE})
    creation_s = time.perf_counter() - started
    created.raise_for_status()
    meter.settle()
    meter.start()
    results, wall = run_parallel(claimer, [(url, i, use_httpx) for i in range(claimers)])
    claim_server_cpu, claim_db_cpu = meter.stop()
    latencies = [lat for lats, _ in results for lat in lats]
    claimed = [c for _, cs in results for c in cs]
    ids = Counter(trial_id for trial_id, _ in claimed)
    points = Counter(params for _, params in claimed)
    http.post("/api/v1/studies", json={"name": "ingest", "num_trials": reporters, "hyperparameters": SPACE})
    leases = [
        http.post("/api/v1/workers/claim", json={"worker_id": "r", "resources": {"cpus": 8}}).json()
        for _ in range(reporters)
    ]
    jobs = [(url, c["trial_id"], c["lease_id"], batches, 2000, use_httpx) for c in leases]
    meter.start()
    sent, ingest_wall = run_parallel(reporter, jobs)
    ingest_server_cpu, ingest_db_cpu = meter.stop()
    stored = _stored_points(meter.database_url, [c["trial_id"] for c in leases])
    n_claims, n_points = len(claimed), sum(sent)
    return {
        "create_10000_trials_s": creation_s,
        "claims": n_claims,
        "claims_per_s": n_claims / wall,
        "claim_p50_ms": 1000 * percentile(latencies, 0.50),
        "claim_p99_ms": 1000 * percentile(latencies, 0.99),
        "trials_claimed_twice": sum(1 for n in ids.values() if n > 1),
        "duplicated_points": sum(n - 1 for n in points.values() if n > 1),
        "claim_server_cpu_ms": 1000 * claim_server_cpu / n_claims,
        "claim_db_cpu_ms": 1000 * claim_db_cpu / n_claims,
        "claim_capacity_per_core": n_claims / (claim_server_cpu + claim_db_cpu),
        "ingest_points_per_s": n_points / ingest_wall,
        "points_acknowledged": n_points,
        "points_stored": stored,
        "point_server_cpu_us": 1e6 * ingest_server_cpu / n_points,
        "point_db_cpu_us": 1e6 * ingest_db_cpu / n_points,
        "ingest_capacity_per_core": n_points / (ingest_server_cpu + ingest_db_cpu),
    }


def _stored_points(database_url: str, trial_ids: list[int]) -> int:
    """Points the database holds for these trials: every acknowledged point, once."""
    engine = create_engine(database_url, poolclass=NullPool)
    with engine.connect() as conn:
        query = text("SELECT count(*) FROM metric_points WHERE trial_id = ANY(:ids)")
        return int(conn.execute(query, {"ids": trial_ids}).scalar_one())


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
    parser.add_argument("--batches", type=int, default=25, help="2,000-point batches per reporter (default 25)")
    parser.add_argument("--no-optuna", action="store_true")
    parser.add_argument("--httpx", action="store_true", help="load generators use httpx instead of http.client")
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    database = fresh_database(args.postgres, "hpo_bench")
    server = start_server(database, args.port, args.server_workers)
    try:
        meter = CpuMeter(server.pid, database)
        figures = bench_hpo(url, args.claimers, args.reporters, args.batches, args.httpx, meter)
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
