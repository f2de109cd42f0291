"""Script-trial benchmark: a `trainer.command` trial under the worker against the same script run by
hand with the same environment.

    .venv/bin/python bench/script_bench.py [--steps 3000] [--repeats 3] [--json out.json]

Everything runs on this machine: an embedded server (SQLite in a temporary folder), a local Ray
instance of 2 CPUs and an in-process `Worker` (one trial at a time), running bench/script_trial.py.

- throughput: the script's own `bench/steps_per_second` under the worker divided by by hand
  (median of `--repeats` each, taking turns); target at least 0.97.
- start: claim -> the first reported step as the worker sees it, on a warm worker, against the
  script's own start-up measured alone (spawn -> its first metrics line, Python and torch import
  included); target within 0.5 s. On a loaded machine the start-up itself varies by seconds from
  run to run, so the worker's own share is also measured within each trial: claim -> first step
  seen, minus the script's process start -> first step (`bench/startup_seconds`)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from hpo.policy import ExecutionPolicy
from hpo.settings import Settings
from hpo.worker.client import API, ServerClient
from hpo.worker.demo import EmbeddedServer
from hpo.worker.loop import Worker, WorkerOptions

BENCH = Path(__file__).resolve().parent
COMMAND = [sys.executable, "script_trial.py"]


def spec(name: str, steps: int, trials: int) -> dict[str, Any]:
    return {
        "name": name,
        "algorithm": "manual",
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "trials": [{"params": {}, "seed": i} for i in range(trials)],
        "trainer": {"command": COMMAND, "max_train_steps": steps, "eval_every_steps": steps},
        "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
    }


def by_hand(folder: Path, steps: int) -> tuple[float, float]:
    """(seconds from spawn to the first metrics line, steps per second) of one run by hand."""
    folder.mkdir(parents=True)
    config = {"params": {}, "seed": 0, "trainer": {"max_train_steps": steps, "eval_every_steps": steps}}
    (folder / "config.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPO_")}
    # A Ray task of 1 CPU runs with OMP_NUM_THREADS=1; so does the script by hand.
    env.update(HPO_CONFIG=str(folder / "config.json"), HPO_OUT_DIR=str(folder / "out"), OMP_NUM_THREADS="1")
    metrics = folder / "out" / "metrics.jsonl"
    started = time.time()
    process = subprocess.Popen(COMMAND, cwd=BENCH, env=env)
    while not (metrics.exists() and metrics.stat().st_size > 0):
        time.sleep(0.002)
    first = time.time() - started
    process.wait()
    return first, steps_per_second(metrics.read_text())


def steps_per_second(text: str) -> float:
    return next(p["value"] for p in map(json.loads, text.splitlines()) if p["name"] == "bench/steps_per_second")


def metric(client: ServerClient, trial_id: int, name: str) -> float:
    return float(client.get(f"{API}/trials/{trial_id}/metrics", params={"name": name})["items"][0]["value"])


def under_worker(url: str, root: Path, steps: int, trials: int) -> tuple[list[float], list[float], list[float]]:
    """(claim -> first step, steps per second, the worker's share of claim -> first step) of each
    trial of one study, after one warm-up trial."""
    client = ServerClient(url)
    options = WorkerOptions(
        unconfined=True,
        server_url=url,
        artifact_root=root,
        idle_poll_seconds=0.05,
        max_trials=1,
        log_to_driver=False,
        policy=ExecutionPolicy().merged(command_prefixes=(shlex.join(COMMAND),)),
        workdir_root=BENCH,
    )
    worker = Worker(options)
    warm = client.post(f"{API}/studies", spec(f"warm-up-{time.time_ns()}", 50, 1))
    study = client.post(f"{API}/studies", spec(f"measured-{time.time_ns()}", steps, trials))

    def done() -> bool:
        counts = [client.get(f"{API}/studies/{s['id']}")["trial_counts"] for s in (warm, study)]
        return all(c["pending"] + c["running"] == 0 for c in counts)

    worker.run(until=done)
    ids = {t["id"] for t in client.get(f"{API}/studies/{study['id']}/trials")["items"]}
    firsts = {trial_id: first for trial_id, _, first in worker.stats.latencies if first is not None}
    latencies = [firsts[t] for t in sorted(ids)]
    rates = [metric(client, t, "bench/steps_per_second") for t in sorted(ids)]
    shares = [firsts[t] - metric(client, t, "bench/startup_seconds") for t in sorted(ids)]
    return latencies, rates, shares


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        settings = Settings(
            database_url=f"sqlite:///{root / 'hpo.db'}",
            artifact_root=root / "artifacts",
            execution_policy=ExecutionPolicy().merged(command_prefixes=(shlex.join(COMMAND),)),
        )
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        hand_first, hand_rate, worker_first, worker_rate, worker_share = [], [], [], [], []
        with EmbeddedServer(settings, 0) as server:
            for repeat in range(args.repeats):  # taking turns, so drift in the machine's load hits both
                first, rate = by_hand(root / f"hand-{repeat}", args.steps)
                hand_first.append(first)
                hand_rate.append(rate)
                firsts, rates, shares = under_worker(server.url, settings.artifact_root, args.steps, 1)
                worker_first += firsts
                worker_rate += rates
                worker_share += shares
        ray.shutdown()
    figures = {
        "steps": args.steps,
        "by_hand_steps_per_second": hand_rate,
        "worker_steps_per_second": worker_rate,
        "throughput_ratio": statistics.median(worker_rate) / statistics.median(hand_rate),
        "by_hand_start_seconds": hand_first,
        "worker_claim_to_first_step_seconds": worker_first,
        "start_gap_seconds": statistics.median(worker_first) - statistics.median(hand_first),
        "worker_share_of_start_seconds": worker_share,
    }
    print(
        f"throughput: worker {statistics.median(worker_rate):.0f} steps/s, by hand "
        f"{statistics.median(hand_rate):.0f} steps/s: ratio {figures['throughput_ratio']:.3f} (target >= 0.97)"
    )
    print(
        f"start: claim -> first step {statistics.median(worker_first):.2f} s under the worker, script start-up "
        f"alone {statistics.median(hand_first):.2f} s: gap {figures['start_gap_seconds']:+.2f} s (target <= 0.5 s); "
        f"the worker's own share within each trial: {statistics.median(worker_share):.2f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
