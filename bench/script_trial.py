"""The training script `bench/script_bench.py` runs, by hand and as a `trainer.command` trial: a small
MLP on random data (one CPU thread), one `train/loss` point a step through `hpo.session()`, and at
the end its own throughput over the steps after the first 20 (`bench/steps_per_second`)."""

from __future__ import annotations

import time

import torch

import hpo


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
        if s.should_stop():
            return
    assert started is not None
    rate = (s.max_train_steps - 20) / (time.perf_counter() - started)
    s.report(s.max_train_steps, {"bench/steps_per_second": rate, "valid/error_rate": 0.0})


if __name__ == "__main__":
    main()
