"""A tutorial-style PyTorch script (argparse flags, a StepLR, a loop that prints its loss), the way
public examples are written, run by hpo unchanged: hpo passes the trial's hyperparameters as flags
through placeholders in `trainer.command` and reads the metrics from the lines it prints
(`trainer.metrics: "stdout"`), so the script imports nothing of hpo and reads no file of hpo's.
The one line a tutorial script may need changed is its print, to name the step and the metric:
`step=120 train/loss=0.31` (docs/scripts.md; or give a pattern for the script's own lines).

    python digits_argparse.py --lr 0.05 --epochs 2     # by hand, as the tutorial says

`--fixed-seed` makes it seed itself with a constant and ignore `--seed`, as many public scripts do:
replicas of such a script cannot differ, and hpo's analysis says so (`seed_ignored`, no verdict;
docs/scripts.md, "Replicas need the seed").
"""

from __future__ import annotations

import argparse

import torch
from digits_data import datasets, evaluate, model
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader

FIXED_SEED = 1234  # what --fixed-seed seeds with, whatever --seed says


def main() -> None:
    parser = argparse.ArgumentParser(description="digits MLP")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate")
    parser.add_argument("--gamma", type=float, default=0.7, help="learning rate step gamma")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--fixed-seed", action="store_true", help="seed with a constant, ignoring --seed")
    args = parser.parse_args()

    torch.manual_seed(FIXED_SEED if args.fixed_seed else args.seed)
    train, valid = datasets()
    net = model(args.hidden)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, drop_last=True)
    step = 0
    for epoch in range(1, args.epochs + 1):
        net.train()
        for x, y in loader:
            step += 1
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            if step % args.log_interval == 0:
                print(f"step={step} train/loss={loss.item():.6f}", flush=True)
        result = evaluate(net, valid)
        print(f"epoch {epoch}: step={step} " + " ".join(f"{k}={v:.6f}" for k, v in result.items()), flush=True)
        scheduler.step()


if __name__ == "__main__":
    main()
