"""A training script that uses hpo's helper (`hpo.session()`, standard library only): parameters,
seed and step budget from the study, metrics, checkpoints written then renamed into place, exact
resume from the checkpoint of an earlier attempt, and SIGTERM (a stop, a lost lease, a drained
worker) answered with a checkpoint and a clean exit (docs/scripts.md).

The data order is a pure function of (seed, step), so a run resumed at step N goes on exactly as
an uninterrupted one would."""

from __future__ import annotations

import math

import torch
from digits_data import datasets, evaluate, model
from torch.utils.data import DataLoader

import hpo


def main() -> None:
    s = hpo.session()
    p = s.params
    torch.manual_seed(s.seed)
    train, valid = datasets()
    net = model(int(p.get("hidden", 64)))
    optimizer = torch.optim.SGD(net.parameters(), lr=float(p.get("learning_rate", 0.1)), momentum=0.9)
    batch_size = int(p.get("batch_size", 64))
    steps_per_epoch = len(train) // batch_size
    step = 0
    if s.resume_from:
        state = torch.load(s.resume_from)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]

    def save() -> None:
        with s.checkpoint(step, ".pt") as path:
            torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)

    while step < s.max_train_steps and not s.should_stop():
        epoch, skip = divmod(step, steps_per_epoch)
        order = torch.Generator().manual_seed(s.seed * 100_003 + epoch)
        loader = DataLoader(train, batch_size=batch_size, shuffle=True, drop_last=True, generator=order)
        for index, (x, y) in enumerate(loader):
            if index < skip:
                continue  # the batches this epoch already trained on before the checkpoint
            step += 1
            loss = torch.nn.functional.cross_entropy(net(x), y)
            if not math.isfinite(loss.item()):
                s.infeasible(f"loss {loss.item()} at step {step}")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            s.report(step, {"train/loss": loss.item()})
            evaluated = step % s.eval_every_steps == 0 or step == s.max_train_steps
            if evaluated:
                s.report(step, evaluate(net, valid))
            if evaluated or s.should_stop():
                save()
            if step >= s.max_train_steps or s.should_stop():
                break


if __name__ == "__main__":
    main()
