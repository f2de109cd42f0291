"""The training script `bench/script_bench.py` runs, by hand and as a `trainer.command` trial: a small
MLP on random data (one CPU thread), one `train/loss` point a step through `hpo.session()`, and at
the end its own throughput over the steps after the first 20 (`bench/steps_per_second`) and its
own start-up: from the process's start (Linux `/proc`) to its first step (`bench/startup_seconds`)."""

from __future__ import annotations

import os
import time

import torch

import hpo


def process_started_at() -> float:
    """Wall-clock time this process started, to 10 ms."""
    with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        up = float(uptime.read().split()[0])
    return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))


def main() -> None:
    s = hpo.session()
    torch.set_num_threads(1)
    torch.manual_seed(s.seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
    started = None
    for step in range(1, s.max_train_steps + 1):
        if step == 21:
            started = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        s.report(step, {"train/loss": loss.item()})
        if step == 1:
            startup = time.time() - process_started_at()
        if s.should_stop():
            return
    assert started is not None
    rate = (s.max_train_steps - 20) / (time.perf_counter() - started)
    s.report(s.max_train_steps, {"bench/steps_per_second": rate, "bench/startup_seconds": startup})
    s.report(s.max_train_steps, {"valid/error_rate": 0.0})


if __name__ == "__main__":
    main()
