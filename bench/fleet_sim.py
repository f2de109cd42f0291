"""Fleet simulation: thousands of simulated GPU workers against 1, 2 and 4 server processes.

Each simulated worker speaks the worker protocol over HTTP (aiohttp, a few client processes with
an event loop each): it claims a trial, heartbeats every `lease/3` seconds (the built-in worker's
cadence), posts a batch of metric points every `--metrics-every` seconds (the built-in worker sends
every 2 s), completes after `--trial-seconds` and claims again. Starts are spread over the first
heartbeat interval, as a fleet's are.

For every (server processes, fleet size) it prints: claims, claim p50/p99, heartbeat p99 and lag
p99 (answer time minus the time the heartbeat was due: what decides whether a lease survives),
metrics p99, points/s, errors, the CPU the server processes and the database's backends used (in
cores), the database connections (-1: Postgres refused more, its max_connections), and whether the
fleet was served (claim p99 < 100 ms, heartbeat lag p99 < 1 s, no errors). A configuration stops
growing its fleet at the first size not served; the limit it names is the database's connections
when Postgres refused one, else the busiest of server, database and the load generators (which
share this machine: on 2 cores the generators' own CPU is part of what saturates).

Latencies are taken in steady state: from a heartbeat interval after each worker's staggered start.

Usage: python bench/fleet_sim.py [--servers 1,2,4] [--fleet 250,500,1000,2000] [--seconds 40]
       [--client-procs 3] [--postgres postgresql+psycopg://postgres@127.0.0.1:5432]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

sys.path.insert(0, str(Path(__file__).parent))
from server_bench import SPACE, CpuMeter, cpu_seconds, fresh_database, percentile  # noqa: E402

LEASE_SECONDS = 15  # heartbeats every 5 s


def start_server(database_url: str, port: int, processes: int) -> Any:
    import subprocess

    env = {**os.environ, "HPO_DATABASE_URL": database_url, "HPO_LEASE_SECONDS": str(LEASE_SECONDS)}
    env["HPO_BAYESIAN_PROCESSES"] = "0"
    command = [sys.executable, "-m", "hpo.cli", "server", "--port", str(port), "--workers", str(processes)]
    process = subprocess.Popen([*command, "--log-level", "warning", "--limit-concurrency", "10000"], env=env)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.3)
    process.kill()
    raise SystemExit("server did not start")


async def _worker(session: Any, url: str, name: str, args: Any, stats: dict[str, Any], stop_at: float) -> None:
    import aiohttp

    heartbeat_every = LEASE_SECONDS / 3
    await asyncio.sleep(random.uniform(0, heartbeat_every))  # a fleet does not start in lockstep
    stats = _Steady(stats, time.monotonic() + heartbeat_every + 1)
    step = 0
    while time.monotonic() < stop_at:
        started = time.monotonic()
        try:
            async with session.post(
                f"{url}/api/v1/workers/claim", json={"worker_id": name, "resources": {"cpus": 8, "gpus": 1}}
            ) as response:
                status = response.status
                claim = await response.json() if status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError):
            stats["errors"] += 1
            await asyncio.sleep(1)
            continue
        stats["claim"].append(time.monotonic() - started)
        if claim is None:
            if status != 204:
                stats["errors"] += 1
            await asyncio.sleep(2)
            continue
        trial, lease = claim["trial_id"], claim["lease_id"]
        end = min(stop_at, started + args.trial_seconds * random.uniform(0.8, 1.2))
        next_beat, next_post = started + heartbeat_every, started + args.metrics_every
        while time.monotonic() < end:
            due = min(next_beat, next_post)
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            try:
                if due == next_beat:
                    t0 = time.monotonic()
                    async with session.post(f"{url}/api/v1/trials/{trial}/heartbeat", json={"lease_id": lease}) as r:
                        await r.read()
                        ok = r.status == 200
                    stats["heartbeat"].append(time.monotonic() - t0)
                    stats["lag"].append(time.monotonic() - due)
                    next_beat += heartbeat_every
                else:
                    points = []
                    for _ in range(args.steps_per_post):
                        step += 1
                        points += [
                            {"step": step, "name": n, "value": 1.0 / step} for n in ("train/loss", "train/grad_norm")
                        ]
                    t0 = time.monotonic()
                    body = {"lease_id": lease, "points": points}
                    async with session.post(f"{url}/api/v1/trials/{trial}/metrics", json=body) as r:
                        await r.read()
                        ok = r.status == 200
                    stats["metrics"].append(time.monotonic() - t0)
                    stats["points"] += len(points) if ok else 0
                    next_post += args.metrics_every
                if not ok:
                    stats["errors"] += 1
                    break
            except (aiohttp.ClientError, asyncio.TimeoutError):
                stats["errors"] += 1
                break
        try:
            async with session.post(f"{url}/api/v1/trials/{trial}/complete", json={"lease_id": lease}) as r:
                await r.read()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            stats["errors"] += 1


class _Steady(dict):  # type: ignore[type-arg]
    """The stats, with latencies kept only after the fleet's staggered start (steady state)."""

    def __init__(self, stats: dict[str, Any], after: float) -> None:
        super().__init__()
        self.stats, self.after = stats, after

    def __getitem__(self, key: str) -> Any:
        if isinstance(self.stats[key], list) and time.monotonic() < self.after:
            return []  # appended to and dropped
        return self.stats[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.stats[key] = value


def client_process(url: str, first: int, count: int, args: Any, stop_at_wall: float, queue: Any) -> None:
    import aiohttp

    async def main() -> dict[str, Any]:
        stats: dict[str, Any] = {"claim": [], "heartbeat": [], "lag": [], "metrics": [], "points": 0, "errors": 0}
        stop_at = time.monotonic() + (stop_at_wall - time.time())
        connector = aiohttp.TCPConnector(limit=count, limit_per_host=count)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await asyncio.gather(
                *(_worker(session, url, f"sim{first + i}", args, stats, stop_at) for i in range(count))
            )
        return stats

    queue.put(asyncio.run(main()))


def run_configuration(args: Any, processes: int, fleet: int, port: int) -> dict[str, Any]:
    database = fresh_database(args.postgres, "hpo_fleet")
    server = start_server(database, port, processes)
    url = f"http://127.0.0.1:{port}"
    try:
        trials = fleet * int(args.seconds / (0.8 * args.trial_seconds) + 2)
        spec = {"name": "fleet", "num_trials": trials, "hyperparameters": SPACE}
        httpx.post(f"{url}/api/v1/studies", json=spec, timeout=120).raise_for_status()
        meter = CpuMeter(server.pid, database)
        meter.settle()
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        stop_at = time.time() + 3 + args.seconds
        share = [
            fleet // args.client_procs + (1 if i < fleet % args.client_procs else 0) for i in range(args.client_procs)
        ]
        clients = [
            ctx.Process(target=client_process, args=(url, sum(share[:i]), n, args, stop_at, queue))
            for i, n in enumerate(share)
        ]
        for client in clients:
            client.start()
        time.sleep(3)  # the clients' start-up is not measured
        meter.start()
        client_cpu0 = cpu_seconds([c.pid for c in clients if c.pid])
        started = time.monotonic()
        time.sleep(max(0.0, stop_at - time.time() - 1))
        connections = _connections(database)
        server_cpu, db_cpu = meter.stop()
        client_cpu = cpu_seconds([c.pid for c in clients if c.pid]) - client_cpu0
        wall = time.monotonic() - started
        results = [queue.get(timeout=120) for _ in clients]
        for client in clients:
            client.join(timeout=60)
    finally:
        server.terminate()
        server.wait(timeout=60)
    merged: dict[str, Any] = {key: [] for key in ("claim", "heartbeat", "lag", "metrics")}
    for result in results:
        for key in merged:
            merged[key] += result[key]
    figures = {
        "server_processes": processes,
        "workers": fleet,
        "claims": len(merged["claim"]),
        "claim_p50_ms": 1000 * percentile(merged["claim"], 0.5) if merged["claim"] else 0.0,
        "claim_p99_ms": 1000 * percentile(merged["claim"], 0.99) if merged["claim"] else 0.0,
        "heartbeats": len(merged["heartbeat"]),
        "heartbeat_p99_ms": 1000 * percentile(merged["heartbeat"], 0.99) if merged["heartbeat"] else 0.0,
        "heartbeat_lag_p99_s": percentile(merged["lag"], 0.99) if merged["lag"] else 0.0,
        "metrics_p99_ms": 1000 * percentile(merged["metrics"], 0.99) if merged["metrics"] else 0.0,
        "points_per_s": sum(r["points"] for r in results) / args.seconds,
        "errors": sum(r["errors"] for r in results),
        "server_cores": server_cpu / wall,
        "db_cores": db_cpu / wall,
        "client_cores": client_cpu / wall,
        "db_connections": connections,
    }
    figures["served"] = figures["claim_p99_ms"] < 100 and figures["heartbeat_lag_p99_s"] < 1 and figures["errors"] == 0
    if connections < 0:
        figures["served"] = False
        figures["busiest"] = "db connections"  # Postgres' max_connections: each process pools up to 40
        return figures
    busiest = max(
        ("server", figures["server_cores"]),
        ("database", figures["db_cores"]),
        ("load generators", figures["client_cores"]),
        key=lambda kv: kv[1],
    )
    figures["busiest"] = busiest[0]
    return figures


def _connections(database_url: str) -> int:
    """The database's connections; -1 when Postgres refuses one more (max_connections reached)."""
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            query = (
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return int(conn.execute(text(query)).scalar_one())
    except OperationalError:
        return -1
    finally:
        engine.dispose()


COLUMNS = (
    ("server_processes", "srv", "{:>3}"),
    ("workers", "workers", "{:>7}"),
    ("claims", "claims", "{:>6}"),
    ("claim_p50_ms", "claim p50", "{:>9.1f}"),
    ("claim_p99_ms", "claim p99", "{:>9.1f}"),
    ("heartbeat_p99_ms", "hb p99", "{:>7.1f}"),
    ("heartbeat_lag_p99_s", "hb lag p99", "{:>10.2f}"),
    ("metrics_p99_ms", "metrics p99", "{:>11.1f}"),
    ("points_per_s", "points/s", "{:>8.0f}"),
    ("errors", "errors", "{:>6}"),
    ("server_cores", "srv cores", "{:>9.2f}"),
    ("db_cores", "db cores", "{:>8.2f}"),
    ("client_cores", "gen cores", "{:>9.2f}"),
    ("db_connections", "db conns", "{:>8}"),
    ("served", "served", "{!s:>6}"),
    ("busiest", "busiest", "{:>15}"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432")
    parser.add_argument("--servers", default="1,2,4", help="server processes to try (default 1,2,4)")
    parser.add_argument("--fleet", default="250,500,1000,2000", help="fleet sizes, growing (default 250,500,1000,2000)")
    parser.add_argument("--seconds", type=float, default=40.0, help="measured seconds per configuration (default 40)")
    parser.add_argument("--trial-seconds", type=float, default=60.0, help="mean trial length (default 60)")
    parser.add_argument("--metrics-every", type=float, default=2.0, help="seconds between metric posts (default 2)")
    parser.add_argument("--steps-per-post", type=int, default=20, help="steps per post, 2 points each (default 20)")
    parser.add_argument("--client-procs", type=int, default=3, help="load generator processes (default 3)")
    parser.add_argument("--port", type=int, default=18900)
    args = parser.parse_args()
    print(
        f"fleet simulation on {os.cpu_count()} cores: lease {LEASE_SECONDS} s "
        f"(heartbeat every {LEASE_SECONDS / 3:g} s), metrics every {args.metrics_every:g} s "
        f"({2 * args.steps_per_post} points), trials ~{args.trial_seconds:g} s; latencies in steady state"
    )
    print(" ".join(header for _, header, _ in COLUMNS))
    for i, processes in enumerate(int(p) for p in args.servers.split(",")):
        best = 0
        for j, fleet in enumerate(int(f) for f in args.fleet.split(",")):
            figures = run_configuration(args, processes, fleet, args.port + 10 * i + j)
            print(" ".join(fmt.format(figures[key]) for key, _, fmt in COLUMNS), flush=True)
            if not figures["served"]:
                print(
                    f"  -> {processes} server process(es): saturated at {fleet} workers "
                    f"({figures['busiest']} busiest); served {best}"
                )
                break
            best = fleet
        else:
            print(f"  -> {processes} server process(es): served every fleet size tried (up to {best})")


if __name__ == "__main__":
    main()
