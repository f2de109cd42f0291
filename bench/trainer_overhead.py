"""Trainer overhead: steps per second of `hpo.trainer.train` against a bare PyTorch loop on the same
model, data, batch size and optimizer, on one CPU thread.

    .venv/bin/python bench/trainer_overhead.py [--steps 1500] [--rounds 5] [--batch-size 128] [--width 256]

- The model is the `synthetic_mlp` workload's MLP (its defaults: 32 features, 10 classes, 2 hidden
  layers of `--width`), built through the workload from the same seed; the data is its training
  set (8,192 examples); the optimizer is Adam at 1e-3 in both.
- The bare loop is what a user would write: index a random batch from the TensorDataset, forward,
  cross-entropy, zero_grad, backward, optimizer step, and `loss.item()` (anyone logs the loss).
- The hpo run keeps its defaults (a metrics.jsonl line per metric every step, gradient norm every
  step, the stop poll), except that evaluation and checkpoints happen only at the last step and the
  sanity checks are off. Its rate is timed from the reporter's `metrics` calls between the warm-up
  step and the step before the last, so start-up, the final evaluation and the final checkpoint are
  not counted; the bare loop is timed over the same steps.
- The two alternate in `--rounds` rounds (which goes first alternates too). Two rates per run:
  `wall` (timed steps over their wall time) and `median` (one over the median step time, which
  shrugs off other processes stealing the CPU now and then on a shared machine). The figures are
  the medians over rounds. Target: hpo / bare >= 0.95."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from hpo.trainer import train
from hpo.trainer.sampling import derive_seed
from hpo.trainer.workloads import SyntheticMLP, resolve_model_params

LEARNING_RATE = 1e-3


def hpo_config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "params": {
            "optimizer": "adam",
            "learning_rate": LEARNING_RATE,
            "batch_size": args.batch_size,
            "width": args.width,
        },
        "trainer": {
            "workload": "synthetic_mlp",
            "max_train_steps": args.steps,
            "eval_every_steps": args.steps,
            "keep_best_checkpoints": 1,
            "sanity_checks": False,
        },
        "resources": {"cpus_per_worker": 1},
        "seed": 0,
    }


class StepClock:
    """A reporter that notes when each step's metrics arrive."""

    def __init__(self) -> None:
        self.times: dict[int, float] = {}

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.times[step] = time.perf_counter()

    def checkpoint(self, step: int, path: str, objective_value: float | None) -> None:
        return None

    def should_stop(self) -> bool:
        return False


def rates(stamps: list[float]) -> tuple[float, float]:
    """(wall, median) steps per second from the end times of consecutive steps."""
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return len(gaps) / (stamps[-1] - stamps[0]), 1.0 / statistics.median(gaps)


def run_hpo(args: argparse.Namespace) -> tuple[float, float]:
    clock = StepClock()
    with tempfile.TemporaryDirectory(prefix="hpo-overhead-") as out:
        result = train(hpo_config(args), Path(out), clock)
    if result.status != "completed":
        raise SystemExit(f"hpo run ended {result.status}: {result.reason}")
    return rates([clock.times[step] for step in range(args.warmup, args.steps)])


def run_bare(args: argparse.Namespace) -> tuple[float, float]:
    workload = SyntheticMLP()
    train_set, _ = workload.datasets()
    torch.manual_seed(derive_seed(0, "init"))
    model = workload.build_model(resolve_model_params(workload, {"width": args.width}))
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(0)
    n = len(train_set)
    stamps = []
    for step in range(1, args.steps):
        index = torch.randint(n, (args.batch_size,), generator=generator)
        inputs, labels = train_set[index]
        loss = F.cross_entropy(model(inputs), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()
        if step >= args.warmup:
            stamps.append(time.perf_counter())
    return rates(stamps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500, help="training steps per run (default 1500)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (bare, hpo) runs (default 5)")
    parser.add_argument("--batch-size", type=int, default=128, help="batch size (default 128)")
    parser.add_argument("--width", type=int, default=256, help="hidden width of the MLP (default 256)")
    parser.add_argument("--warmup", type=int, default=100, help="steps not timed at the start (default 100)")
    args = parser.parse_args()
    if not 0 < args.warmup < args.steps - 1:
        parser.error("need 0 < --warmup < --steps - 1")
    torch.set_num_threads(1)  # hpo sets it from resources.cpus_per_worker too

    print(f"synthetic_mlp, width {args.width}, batch {args.batch_size}, adam, {args.steps} steps, 1 thread")
    found: dict[str, list[tuple[float, float]]] = {"bare": [], "hpo": []}
    for round_ in range(args.rounds):
        order = [("bare", run_bare), ("hpo", run_hpo)]
        for name, run in order if round_ % 2 == 0 else reversed(order):
            found[name].append(run(args))
        (bw, bm), (hw, hm) = found["bare"][-1], found["hpo"][-1]
        print(
            f"round {round_ + 1}: steps/s wall: bare {bw:6.1f}  hpo {hw:6.1f}   median: bare {bm:6.1f}  hpo {hm:6.1f}"
        )
    for kind, column in (("wall", 0), ("median", 1)):
        bare = statistics.median(r[column] for r in found["bare"])
        hpo = statistics.median(r[column] for r in found["hpo"])
        print(f"{kind:>6}: bare {bare:6.1f} steps/s, hpo {hpo:6.1f} steps/s, hpo / bare = {hpo / bare:.3f}")
    print("target: hpo / bare >= 0.95")


if __name__ == "__main__":
    main()
