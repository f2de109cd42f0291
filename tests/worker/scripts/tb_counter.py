"""A script that logs only to TensorBoard (torch's SummaryWriter) and takes its hyperparameters as
flags: the `tensorboard` collector must turn its scalars into hpo's points unchanged."""

import argparse
import math

from torch.utils.tensorboard import SummaryWriter

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--logdir", required=True)
parser.add_argument("--steps", type=int, default=30)
args = parser.parse_args()
writer = SummaryWriter(args.logdir)
for step in range(1, args.steps + 1):
    writer.add_scalar("train/loss", math.exp(-args.lr * step), step)
    if step % 10 == 0:
        writer.add_scalar("valid/error_rate", 0.5 * math.exp(-args.lr * step), step)
writer.close()
