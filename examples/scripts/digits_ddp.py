"""A DDP training script written for `torchrun` (`torchrun --nproc-per-node 2 digits_ddp.py`), run
by hpo unchanged with `resources.workers = 2`: the worker sets RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun does, and the script calls
`init_process_group` itself. Each rank reads its share of every batch through a
`DistributedSampler`; only rank 0 writes metrics and checkpoints (the helper does nothing on the
other ranks). A stop (SIGTERM reaches every rank) is agreed through an all-reduce, so no rank
leaves the others waiting in a collective."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from digits_data import datasets, evaluate, model
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import hpo


def main() -> None:
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    s = hpo.session()
    p = s.params
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(s.seed)
    train, valid = datasets()
    net = model(int(p.get("hidden", 64)))
    optimizer = torch.optim.SGD(net.parameters(), lr=float(p.get("learning_rate", 0.1)), momentum=0.9)
    step = 0
    if s.resume_from:  # every rank loads rank 0's checkpoint
        state = torch.load(s.resume_from)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    ddp = DistributedDataParallel(net)
    global_batch = int(p.get("batch_size", 64))
    sampler = DistributedSampler(train, shuffle=True, seed=s.seed, drop_last=True)
    loader = DataLoader(train, batch_size=global_batch // dist.get_world_size(), sampler=sampler, drop_last=True)
    steps_per_epoch = len(loader)
    stop = False
    while step < s.max_train_steps and not stop:
        epoch, skip = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)
        for index, (x, y) in enumerate(loader):
            if index < skip:
                continue
            step += 1
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            flags = torch.tensor([loss.item(), float(s.should_stop())])
            dist.all_reduce(flags)  # the mean loss for the report, and whether any rank was asked to stop
            stop = flags[1].item() > 0
            s.report(step, {"train/loss": flags[0].item() / dist.get_world_size()})
            evaluated = step % s.eval_every_steps == 0 or step == s.max_train_steps
            if evaluated:
                s.report(step, evaluate(net, valid))
            if (evaluated or stop) and s.is_main:
                with s.checkpoint(step, ".pt") as path:
                    torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)
            if step >= s.max_train_steps or stop:
                break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
