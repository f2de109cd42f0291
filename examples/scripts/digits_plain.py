"""A plain PyTorch training script with its own epoch loop and a DataLoader, run by hpo as it is:
it imports nothing of hpo. It reads its hyperparameters from the JSON file `$HPO_CONFIG` and appends
`{"step", "name", "value"}` lines to `$HPO_OUT_DIR/metrics.jsonl` (docs/scripts.md). It writes no
checkpoint, so an interrupted trial starts again from scratch.

    python digits_plain.py --epochs 3       # by hand: HPO_CONFIG unset, defaults below
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import torch
from digits_data import datasets, evaluate, model
from torch.utils.data import DataLoader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    config = json.loads(Path(os.environ["HPO_CONFIG"]).read_text()) if "HPO_CONFIG" in os.environ else {}
    params = config.get("params", {})
    out = Path(os.environ.get("HPO_OUT_DIR", "run"))
    out.mkdir(parents=True, exist_ok=True)
    metrics = (out / "metrics.jsonl").open("a")

    def report(step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            metrics.write(json.dumps({"step": step, "name": name, "value": value}) + "\n")
        metrics.flush()

    torch.manual_seed(config.get("seed", 0))
    train, valid = datasets()
    net = model(int(params.get("hidden", 64)))
    optimizer = torch.optim.SGD(net.parameters(), lr=float(params.get("learning_rate", 0.1)), momentum=0.9)
    loader = DataLoader(train, batch_size=int(params.get("batch_size", 64)), shuffle=True, drop_last=True)
    step = 0
    for _epoch in range(args.epochs):
        for x, y in loader:
            step += 1
            loss = torch.nn.functional.cross_entropy(net(x), y)
            if not math.isfinite(loss.item()):  # diverged: a property of the point, never retried
                (out / "result.json").write_text(json.dumps({"status": "infeasible", "reason": f"loss {loss.item()}"}))
                return
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            report(step, {"train/loss": loss.item()})
        report(step, evaluate(net, valid))


if __name__ == "__main__":
    main()
