"""Benchmark of `algorithm: "bayesian"` (docs/bayesian.md), in three parts:

- quality: median simple regret after a budget of 40 trials run by 4 concurrent workers (trial
  durations drawn at random, so results arrive out of order) on Branin, Hartmann-6, a constrained
  Branin (unknown constraint: the trial only reports infeasible) and a tuning-like surface in four
  hyperparameters with a divergent region next to the optimum; against random search with twice
  the budget (the playbook's baseline) and Optuna's GPSampler and TPESampler (constant liar) with
  the same budget and concurrency. The bayesian runs use the service's own designer and queue
  policy (Halton start of max(5, 2 x dims), then proposals made when the queue of
  `queue_size` proposals has room, with running and queued trials as pending points).
- latency: claim latency over HTTP with 16 concurrent workers on a bayesian study whose queue the
  server's refiller keeps filled (SQLite file, one server process).
- batch: time of one designer call (a batch of 4) at 300 observations in 10 dimensions.

    .venv/bin/python bench/bayesian_bench.py quality [--seeds 10] [--problems branin,hartmann6,...]
    .venv/bin/python bench/bayesian_bench.py latency
    .venv/bin/python bench/bayesian_bench.py batch

Each quality run is appended to --out (JSON lines) as it finishes, so a long run can be summarised
while it goes (`summary` reads the file)."""

from __future__ import annotations

import argparse
import heapq
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import qmc

from hpo.server.bayesian.designer import Problem, propose
from hpo.server.space.dimension import map_unit
from hpo.server.spec.model import Hyperparameter

BUDGET = 40
WORKERS = 4
QUEUE = 2


# --- problems: functions of a unit point; None means infeasible ---------------------------------


def _branin_xy(u: list[float]) -> tuple[float, float]:
    return -5 + 15 * u[0], 15 * u[1]


def branin(u: list[float]) -> float | None:
    x1, x2 = _branin_xy(u)
    return (
        (x2 - 5.1 / (4 * math.pi**2) * x1**2 + 5 / math.pi * x1 - 6) ** 2
        + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1)
        + 10
    )


def constrained_branin(u: list[float]) -> float | None:
    # Infeasible outside a disc that keeps one of Branin's three minima (Gardner et al. 2014 use
    # the same kind of constraint): two basins the model must learn to avoid.
    x1, x2 = _branin_xy(u)
    return branin(u) if (x1 - 2.5) ** 2 + (x2 - 7.5) ** 2 <= 50 else None


_H6_A = np.array(
    [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
)
_H6_P = 1e-4 * np.array(
    [
        [1312, 1696, 5569, 124, 8283, 5886],
        [2329, 4135, 8307, 3736, 1004, 9991],
        [2348, 1451, 3522, 2883, 3047, 6650],
        [4047, 8828, 8732, 5743, 1091, 381],
    ]
)
_H6_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])


def hartmann6(u: list[float]) -> float | None:
    x = np.asarray(u)
    return float(-np.sum(_H6_ALPHA * np.exp(-np.sum(_H6_A * (x - _H6_P) ** 2, axis=1))))


_TUNING = [
    Hyperparameter(name="learning_rate", role="nuisance", type="float", min=1e-4, max=1.0, scale="log"),
    Hyperparameter(name="momentum", role="nuisance", type="float", min=0.5, max=0.999, scale="reverse_log"),
    Hyperparameter(name="weight_decay", role="nuisance", type="float", min=1e-6, max=1e-2, scale="log"),
    Hyperparameter(name="dropout", role="nuisance", type="float", min=0.0, max=0.5),
]


def tuning(u: list[float]) -> float | None:
    """A validation-error-like surface: best at the edge of stability (effective learning rate
    lr / (1 - momentum) = 10^-0.5), divergent (infeasible) beyond 10^-0.3, as real training is."""
    lr, momentum, wd, dropout = (map_unit(hp, x) for hp, x in zip(_TUNING, u, strict=True))
    effective = math.log10(lr / (1 - momentum))
    if effective > -0.3:
        return None
    return (
        0.1
        + 0.05 * (effective + 0.5) ** 2
        + 0.02 * (math.log10(1 - momentum) + 1.5) ** 2
        + 0.005 * (math.log10(wd) + 4) ** 2
        + 0.1 * (dropout - 0.1) ** 2
    )


@dataclass(frozen=True)
class Bench:
    name: str
    dims: int
    f: Callable[[list[float]], float | None]
    optimum: float


PROBLEMS = {
    "branin": Bench("branin", 2, branin, 0.397887),
    "hartmann6": Bench("hartmann6", 6, hartmann6, -3.32237),
    "constrained_branin": Bench("constrained_branin", 2, constrained_branin, 0.397887),
    "tuning": Bench("tuning", 4, tuning, 0.1),
}


# --- asynchronous runs: WORKERS workers, each trial takes a random time ---------------------------


def simulate(bench: Bench, seed: int, budget: int, ask: Callable[[list[list[float]]], list[float]], tell: Any) -> list:
    """Runs `budget` trials on WORKERS workers; `ask(running)` gives the next point, `tell(point,
    value)` reports it. Answers the values in order of completion."""
    rng = np.random.default_rng([seed, 99])
    running: list[tuple[float, int, list[float]]] = []
    started, now, values = 0, 0.0, []
    while len(values) < budget:
        while len(running) < WORKERS and started < budget:
            point = ask([p for _, _, p in running])
            heapq.heappush(running, (now + float(rng.uniform(0.5, 1.5)), started, point))
            started += 1
        now, _, point = heapq.heappop(running)
        value = bench.f(point)
        tell(point, value)
        values.append(value)
    return values


def run_bayesian(bench: Bench, seed: int, budget: int = BUDGET) -> list:
    """The service's policy: a Halton start, then a queue of QUEUE proposals topped up right after
    each claim (so a proposal may wait for a worker while other results come in)."""
    initial = max(5, 2 * bench.dims)
    halton = qmc.Halton(bench.dims, scramble=True, seed=seed).random(budget).tolist()
    observed: list[list[float]] = []
    results: list[float | None] = []
    queue: list[list[float]] = []
    made = [0]

    def refill(pending: list[list[float]]) -> None:
        q = min(QUEUE - len(queue), budget - made[0])
        if q <= 0:
            return
        problem = Problem(
            dims=bench.dims,
            observed=list(observed),
            values=list(results),
            pending=pending + queue,
            q=q,
            seed=seed * 1000 + made[0],
            fallback=halton[made[0] : made[0] + q],
        )
        queue.extend(propose(problem).points)
        made[0] += q

    def ask(running: list[list[float]]) -> list[float]:
        if made[0] < initial:
            made[0] += 1
            return halton[made[0] - 1]
        if not queue:
            refill(running)
        point = queue.pop(0)
        refill([*running, point])
        return point

    def tell(point: list[float], value: float | None) -> None:
        observed.append(point)
        results.append(value)

    return simulate(bench, seed, budget, ask, tell)


def run_random(bench: Bench, seed: int, budget: int = 2 * BUDGET) -> list:
    rng = np.random.default_rng([seed, 7])
    return simulate(bench, seed, budget, lambda _running: rng.random(bench.dims).tolist(), lambda *_: None)


def run_optuna(bench: Bench, seed: int, sampler_name: str, budget: int = BUDGET) -> list:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = (
        optuna.samplers.GPSampler(seed=seed)
        if sampler_name == "optuna_gp"
        else optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    )
    study = optuna.create_study(sampler=sampler, direction="minimize")
    trials: dict[tuple[float, ...], Any] = {}

    def ask(_running: list[list[float]]) -> list[float]:
        trial = study.ask()
        point = [trial.suggest_float(f"x{i}", 0.0, 1.0) for i in range(bench.dims)]
        trials[tuple(point)] = trial
        return point

    def tell(point: list[float], value: float | None) -> None:
        trial = trials.pop(tuple(point))
        # An infeasible trial fails, as a diverged run does in Optuna (samplers then ignore it).
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, value)

    return simulate(bench, seed, budget, ask, tell)


METHODS: dict[str, Callable[[Bench, int], list]] = {
    "bayesian": run_bayesian,
    "random_2x": run_random,
    "optuna_gp": lambda b, s: run_optuna(b, s, "optuna_gp"),
    "optuna_tpe": lambda b, s: run_optuna(b, s, "optuna_tpe"),
}


def regret(bench: Bench, values: list) -> float:
    feasible = [v for v in values if v is not None]
    return (min(feasible) - bench.optimum) if feasible else math.inf


def quality(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    out = Path(args.out)
    for name in args.problems.split(","):
        bench = PROBLEMS[name]
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for method in args.methods.split(","):
                start = time.perf_counter()
                values = METHODS[method](bench, seed)
                row = {
                    "problem": name,
                    "method": method,
                    "seed": seed,
                    "regret": regret(bench, values),
                    "infeasible": sum(v is None for v in values),
                    "trials": len(values),
                    "seconds": round(time.perf_counter() - start, 2),
                }
                with out.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    summary(args)


def summary(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]
    problems = list(dict.fromkeys(r["problem"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    print(f"{'problem':20s}" + "".join(f"{m:>22s}" for m in methods))
    for problem in problems:
        cells = []
        for method in methods:
            mine = [r for r in rows if r["problem"] == problem and r["method"] == method]
            if not mine:
                cells.append(f"{'-':>22s}")
                continue
            med = statistics.median(r["regret"] for r in mine)
            secs = statistics.mean(r["seconds"] for r in mine)
            cells.append(f"{med:>10.4g} (n={len(mine):2d},{secs:4.0f}s)")
        print(f"{problem:20s}" + "".join(cells))
    print("median simple regret after the budget (n = seeds, mean seconds a run)")


# --- batch time -----------------------------------------------------------------------------------


def batch(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    x = rng.random((300, 10))
    y = (np.sum((x - 0.3) ** 2, axis=1) + 0.01 * rng.standard_normal(300)).tolist()
    values: list[float | None] = [None if p[0] > 0.9 else v for p, v in zip(x.tolist(), y, strict=True)]
    times, cpu = [], []
    for repeat in range(args.repeats):
        problem = Problem(
            dims=10, observed=x.tolist(), values=values, pending=rng.random((4, 10)).tolist(), q=4, seed=repeat
        )
        start, start_cpu = time.perf_counter(), time.process_time()
        proposal = propose(problem)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        print(
            f"batch of 4 at 300 observations in 10 dims ({proposal.model}): "
            f"{times[-1]:.2f} s wall, {cpu[-1]:.2f} s CPU",
            flush=True,
        )
    # CPU time is what the call costs on an idle machine (one torch thread); wall time also
    # counts whatever else the machine was running.
    print(
        f"median {statistics.median(times):.2f} s wall, {statistics.median(cpu):.2f} s CPU over {len(times)} "
        f"(torch threads {args.threads})"
    )


# --- claim latency --------------------------------------------------------------------------------


WARM_UP_SECONDS = 2.0


def _latency_worker(url: str, worker: int, seconds: float, barrier: Any, queue: Any) -> None:
    from server_bench import JsonClient  # bench/ is on sys.path

    client = JsonClient(url, use_httpx=False)
    samples: list[tuple[float, int, float]] = []  # (latency, status, seconds into the run)
    barrier.wait()
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        started = time.perf_counter()
        code, body = client.post(
            "/api/v1/workers/claim", {"worker_id": f"w{worker}", "resources": {"cpus": 4, "gpus": 0}}
        )
        samples.append((time.perf_counter() - started, code, time.monotonic() - stop + seconds))
        if code != 200:
            time.sleep(0.25)  # a worker's poll interval when nothing is pending
            continue
        time.sleep(1.0)  # the trial runs
        value = sum((v - 0.3) ** 2 for v in body["config"]["params"].values())
        lease, trial = body["lease_id"], body["trial_id"]
        client.post(
            f"/api/v1/trials/{trial}/metrics",
            {"lease_id": lease, "points": [{"step": 1, "name": "valid/loss", "value": value}]},
        )
        client.post(f"/api/v1/trials/{trial}/complete", {"lease_id": lease})
    queue.put(samples)


def latency(args: argparse.Namespace) -> None:
    """16 worker processes against `hpo server --workers 2` on Postgres; each claims, runs a 1 s
    trial, reports and completes it, or waits 0.25 s after a 204."""
    from server_bench import fresh_database, percentile, run_parallel, start_server

    spec = {
        "name": "latency",
        "algorithm": "bayesian",
        "num_trials": 100_000,
        "objective": {"metric": "valid/loss", "mode": "min"},
        # Names the built-in workload knows (the server checks them); the workers below never run it.
        "hyperparameters": [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"},
            {"name": "weight_decay", "role": "nuisance", "type": "float", "min": 1e-6, "max": 1e-1, "scale": "log"},
            {"name": "momentum", "role": "nuisance", "type": "float", "min": 0.0, "max": 0.99},
            {"name": "dropout", "role": "nuisance", "type": "float", "min": 0.0, "max": 0.5},
        ],
        "bayesian": {"queue_size": 16, "initial_trials": 16},
    }
    if args.algorithm == "halton":  # the control: the same load without a model
        spec = {**spec, "algorithm": "halton", "bayesian": None}
    server = start_server(fresh_database(args.postgres, "hpo_bayes_bench"), args.port, 2)
    try:
        import httpx

        url = f"http://127.0.0.1:{args.port}"
        created = httpx.post(f"{url}/api/v1/studies", json=spec, timeout=30)
        assert created.status_code == 201, created.text
        results, _ = run_parallel(_latency_worker, [(url, i, args.seconds) for i in range(16)])
        with httpx.Client(base_url=url) as http:
            trials = http.get("/api/v1/studies/1").json()["trial_counts"]
    finally:
        server.terminate()
        server.wait()
    samples = [s for result in results for s in result]
    times = [t for t, _, _ in samples]
    # The 16 first claims arrive together on cold connections (each server process opens its
    # database connections then): reported apart from the steady state that follows.
    first = [t for t, _, at in samples if at < WARM_UP_SECONDS]
    steady = [t for t, _, at in samples if at >= WARM_UP_SECONDS]
    got = sum(1 for _, c, _ in samples if c == 200)
    print(
        f"{args.algorithm}: 16 workers, {len(times)} claims in {args.seconds:.0f} s "
        f"({got} got a trial, {len(times) - got} answered 204; study: {trials}):\n"
        f"  all claims p50 {percentile(times, 0.5) * 1000:.1f} ms, p99 {percentile(times, 0.99) * 1000:.1f} ms\n"
        f"  after the first {WARM_UP_SECONDS:.0f} s ({len(steady)} claims):"
        f" p50 {percentile(steady, 0.5) * 1000:.1f} ms,"
        f" p99 {percentile(steady, 0.99) * 1000:.1f} ms, max {max(steady) * 1000:.1f} ms\n"
        f"  the first {WARM_UP_SECONDS:.0f} s ({len(first)} claims, cold connections): max {max(first) * 1000:.1f} ms"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="part", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--seeds", type=int, default=10)
    q.add_argument("--first-seed", type=int, default=0)
    q.add_argument("--problems", default=",".join(PROBLEMS))
    q.add_argument("--methods", default=",".join(METHODS))
    q.add_argument("--out", default="bayesian_bench.jsonl")
    s = sub.add_parser("summary")
    s.add_argument("--out", default="bayesian_bench.jsonl")
    b = sub.add_parser("batch")
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--threads", type=int, default=1)
    lat = sub.add_parser("latency")
    lat.add_argument("--seconds", type=float, default=30.0)
    lat.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432")
    lat.add_argument("--port", type=int, default=8771)
    lat.add_argument("--algorithm", choices=["bayesian", "halton"], default="bayesian")
    args = parser.parse_args(argv)
    {"quality": quality, "summary": summary, "batch": batch, "latency": latency}[args.part](args)


if __name__ == "__main__":
    main()
