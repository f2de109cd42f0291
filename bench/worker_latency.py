"""Worker benchmark: latency from claim to first training step, DDP start-up against bare Ray
Train, throughput under the worker against `hpo train`, and how many trials run at once.

    .venv/bin/python bench/worker_latency.py [--cpus 2] [--trials 6] [--json bench/results/worker.json]

Everything runs on this machine: an embedded server (SQLite in a temporary folder), a local Ray
instance of `--cpus` CPUs, an in-process `Worker` and the real trainer (`synthetic_mlp`).

- claim -> first step: wall time from the claim's answer to the trainer's first `metrics` call on
  rank 0, for one-process trials on a warm worker (a plain Ray task each); target under 2 s.
- DDP start: the same for a 2-process trial (Ray Train `TorchTrainer`, gloo) on one long-running
  worker, next to bare Ray Train running the same trainer: `fit()` called -> first step, taking
  turns; and the first DDP run on a new Ray instance for each side (`--fresh-repeats`), since the
  first Ray Train run on a cluster is 1-3 s slower whoever runs it. Target: no slower.
- throughput: mean `train/examples_per_second` of one trial under the worker, divided by the same
  config run by `hpo train`; target at least 0.95.
- concurrency: the most trials the worker ran at once, for 1-CPU and for 0.5-CPU trials."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import ray

from hpo.settings import Settings
from hpo.worker.client import API, ServerClient
from hpo.worker.demo import EmbeddedServer
from hpo.worker.loop import Worker, WorkerOptions

REPO = Path(__file__).resolve().parents[1]


def spec(name: str, num_trials: int, steps: int, workers: int = 1, cpus: float = 1.0) -> dict[str, Any]:
    return {
        "name": name,
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "num_trials": num_trials,
        "hyperparameters": [
            {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-3, "max": 1e-1, "scale": "log"},
            {"name": "optimizer", "role": "fixed", "value": "adam"},
            {"name": "batch_size", "role": "fixed", "value": 64},
        ],
        "trainer": {"workload": "synthetic_mlp", "max_train_steps": steps, "eval_every_steps": max(1, steps // 2)},
        "resources": {"workers": workers, "cpus_per_worker": cpus, "gpus_per_worker": 0},
    }


def run_study(url: str, root: Path, body: dict[str, Any]) -> tuple[Worker, dict[str, Any]]:
    """Creates the study and runs an in-process worker until it is done."""
    client = ServerClient(url)
    study = client.post(f"{API}/studies", body)

    def done() -> bool:
        counts = client.get(f"{API}/studies/{study['id']}")["trial_counts"]
        return counts["pending"] + counts["running"] == 0

    worker = Worker(
        WorkerOptions(unconfined=True, server_url=url, artifact_root=root, idle_poll_seconds=0.2, log_to_driver=False)
    )
    worker.run(until=done)
    return worker, study


def trial_config(trial: dict[str, Any], study: dict[str, Any]) -> dict[str, Any]:
    """The object a claim carries (and `hpo train --config` reads) for this trial."""
    spec = study["spec"]
    return {
        "params": trial["params"],
        "seed": trial["seed"],
        "trainer": spec["trainer"],
        "objective": spec["objective"],
        "resources": spec["resources"],
    }


def claim_to_first_step(worker: Worker) -> list[float]:
    return [first for _, _, first in worker.stats.latencies if first is not None]


def mean_throughput(metrics_file: Path, skip: int = 10) -> float:
    """Mean examples/s over the run, leaving out the first `skip` steps (allocation, caches)."""
    values = [
        p["value"]
        for p in map(json.loads, metrics_file.read_text().splitlines())
        if p["name"] == "train/examples_per_second" and p["step"] > skip
    ]
    return statistics.fmean(values)


def throughput_ratio(url: str, root: Path, steps: int) -> dict[str, float]:
    worker, study = run_study(url, root, spec("throughput", 1, steps))
    trial = ServerClient(url).get(f"{API}/studies/{study['id']}/trials")["items"][0]
    under_worker = mean_throughput(root / "trials" / str(trial["id"]) / "attempt-1" / "metrics.jsonl")
    out = root / "hpo-train"
    (root / "config.json").write_text(json.dumps(trial_config(trial, study)))
    subprocess.run(
        [sys.executable, "-m", "hpo.cli", "train", "--config", str(root / "config.json"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    alone = mean_throughput(out / "metrics.jsonl")
    return {"worker_examples_per_s": under_worker, "hpo_train_examples_per_s": alone, "ratio": under_worker / alone}


def bare_ray_train_start(root: Path, config: dict[str, Any], workers: int) -> tuple[float, float]:
    """Seconds from `TorchTrainer.fit()` to rank 0's training function, and to the trainer's first
    step, without hpo's worker."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    stamp = ray.remote(num_cpus=0)(_Stamp).remote()
    started = time.time()
    TorchTrainer(
        _bare_loop,
        train_loop_config={"config": config, "out": str(root / f"bare-{time.time_ns()}"), "stamp": stamp},
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=str(root / "ray-train"), name=f"bare-{time.time_ns()}"),
        torch_config=TorchConfig(backend="gloo"),
    ).fit()
    times = ray.get(stamp.get.remote())
    return times["started"] - started, times["first_step"] - started


class _Stamp:
    """When rank 0's training function started, and when its first step ended."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def put(self, what: str, when: float) -> None:
        self.times.setdefault(what, when)

    def get(self) -> dict[str, float]:
        return self.times


class _StampReporter:
    def __init__(self, stamp: Any) -> None:
        self.stamp, self.done = stamp, False

    def metrics(self, step: int, values: dict[str, float]) -> None:
        if not self.done:
            self.done = True
            ray.get(self.stamp.put.remote("first_step", time.time()))

    def checkpoint(self, step: int, path: Any, objective_value: float | None) -> None:
        pass

    def should_stop(self) -> bool:
        return False


def _bare_loop(cfg: dict[str, Any]) -> None:
    from ray import train as ray_train

    from hpo.trainer import train

    rank = ray_train.get_context().get_world_rank()
    if rank == 0:
        ray.get(cfg["stamp"].put.remote("started", time.time()))
    train(cfg["config"], Path(cfg["out"]), _StampReporter(cfg["stamp"]) if rank == 0 else None)


def ddp_start(url: str, root: Path, steps: int, repeats: int) -> dict[str, Any]:
    """(start of rank 0's training function, first step) in seconds, for the worker (from the
    claim) and for bare Ray Train (from `fit()`), taking turns on the same Ray instance. The worker
    is one long-running worker, as in production: started (and warmed up) once, it claims each DDP
    study as it appears and idles in between while bare Ray Train runs. The order alternates: the
    first Ray Train run on a cluster pays one-time costs (about a second here)."""
    client = ServerClient(url)
    worker = Worker(
        WorkerOptions(unconfined=True, server_url=url, artifact_root=root, idle_poll_seconds=0.2, log_to_driver=False)
    )
    thread = threading.Thread(target=worker.run, name="bench-worker")
    thread.start()
    under_worker: list[tuple[float, float]] = []
    bare: list[tuple[float, float]] = []
    config: dict[str, Any] | None = None
    try:
        for i in range(repeats):
            for side in ("worker", "bare") if i % 2 == 0 else ("bare", "worker"):
                if side == "bare":
                    assert config is not None  # the first repeat runs the worker first
                    bare.append(bare_ray_train_start(root, config, 2))
                    continue
                seen = len(worker.stats.latencies)
                study = client.post(f"{API}/studies", spec(f"ddp-{i}", 1, steps, workers=2))
                while len(worker.stats.latencies) == seen:
                    time.sleep(0.1)
                _, start, first = worker.stats.latencies[-1]
                assert start is not None and first is not None, "the DDP trial reached no first step"
                under_worker.append((start, first))
                trial = client.get(f"{API}/studies/{study['id']}/trials")["items"][0]
                config = trial_config(trial, study)
    finally:
        worker.request_shutdown()
        thread.join()
    return {"worker_s": under_worker, "bare_ray_train_s": bare}


def first_ddp(side: str, cpus: int, steps: int) -> tuple[float, float]:
    """(rank 0 starts, first step) of the first Ray Train run on a new Ray instance: the worker's
    DDP trial, or bare Ray Train with the same config."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        settings = Settings(database_url=f"sqlite:///{root / 'hpo.db'}", artifact_root=root / "artifacts")
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
        try:
            with EmbeddedServer(settings, 0) as server:
                body = spec("first-ddp", 1, steps, workers=2)
                if side == "bare":
                    config = {key: body[key] for key in ("trainer", "objective", "resources")}
                    config.update(params={"learning_rate": 0.01, "optimizer": "adam", "batch_size": 64}, seed=1)
                    return bare_ray_train_start(root, config, 2)
                worker, _ = run_study(server.url, settings.artifact_root, body)
                _, start, first = worker.stats.latencies[-1]
                assert start is not None and first is not None, "the DDP trial reached no first step"
                return start, first
        finally:
            ray.shutdown()


def fresh_cluster_run(side: str, cpus: int, steps: int) -> tuple[float, float]:
    """`first_ddp` in a new process, so that each run starts its own Ray instance."""
    command = [sys.executable, __file__, "--first-ddp", side, "--cpus", str(cpus), "--steps", str(steps)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    start, first = json.loads(output.strip().splitlines()[-1])
    return start, first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--trials", type=int, default=6, help="one-process trials for the latency figure")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--throughput-steps", type=int, default=3000)
    parser.add_argument("--ddp-repeats", type=int, default=4)
    parser.add_argument("--fresh-repeats", type=int, default=2, help="first DDP runs on new Ray instances, per side")
    parser.add_argument("--first-ddp", choices=("worker", "bare"), help=argparse.SUPPRESS)  # one fresh-cluster run
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.first_ddp:
        print(json.dumps(first_ddp(args.first_ddp, args.cpus, args.steps)))
        return 0
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        settings = Settings(database_url=f"sqlite:///{root / 'hpo.db'}", artifact_root=root / "artifacts")
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        with EmbeddedServer(settings, 0) as server:
            worker, _ = run_study(server.url, settings.artifact_root, spec("latency", args.trials, args.steps))
            figures["claim_to_first_step_s"] = claim_to_first_step(worker)
            figures["concurrent_1cpu_trials"] = worker.stats.max_running
            worker, _ = run_study(
                server.url, settings.artifact_root, spec("half-cpu", 2 * args.cpus, args.steps, cpus=0.5)
            )
            figures["concurrent_half_cpu_trials"] = worker.stats.max_running
            figures["throughput"] = throughput_ratio(server.url, settings.artifact_root, args.throughput_steps)
            figures["ddp_start"] = ddp_start(server.url, settings.artifact_root, args.steps, args.ddp_repeats)
        ray.shutdown()
    figures["first_ddp_on_fresh_cluster"] = {
        side: [fresh_cluster_run(side, args.cpus, args.steps) for _ in range(args.fresh_repeats)]
        for side in ("worker", "bare")
    }
    report(figures)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


def report(figures: dict[str, Any]) -> None:
    latencies = figures["claim_to_first_step_s"]
    ddp = figures["ddp_start"]
    throughput = figures["throughput"]
    print(
        f"claim -> first step, 1 process (Ray task): median {statistics.median(latencies):.2f} s, "
        f"max {max(latencies):.2f} s over {len(latencies)} trials (target < 2 s)"
    )
    print(
        "DDP start, 2 processes, (rank 0 starts, first step), in run order: worker from the claim "
        f"{_pairs(ddp['worker_s'])}; bare Ray Train from fit() {_pairs(ddp['bare_ray_train_s'])}"
    )
    for name, runs in (("worker", ddp["worker_s"]), ("bare Ray Train", ddp["bare_ray_train_s"])):
        later = [first for _, first in runs[1:]] or [runs[0][1]]
        median = statistics.median(later)
        print(f"  {name}: first run {runs[0][1]:.1f} s to the first step, median of the others {median:.1f} s")
    fresh = figures["first_ddp_on_fresh_cluster"]
    print(
        "first DDP run on a new Ray instance, (rank 0 starts, first step): "
        f"worker {_pairs(fresh['worker'])}; bare Ray Train {_pairs(fresh['bare'])}"
    )
    print(
        f"throughput: {throughput['worker_examples_per_s']:.0f} examples/s under the worker, "
        f"{throughput['hpo_train_examples_per_s']:.0f} under hpo train: ratio {throughput['ratio']:.3f} "
        "(target >= 0.95)"
    )
    print(
        f"trials at once: {figures['concurrent_1cpu_trials']} of 1 CPU, "
        f"{figures['concurrent_half_cpu_trials']} of 0.5 CPU"
    )


def _pairs(values: list[tuple[float, float]]) -> str:
    return ", ".join(f"({a:.1f} s, {b:.1f} s)" for a, b in values)


if __name__ == "__main__":
    raise SystemExit(main())
