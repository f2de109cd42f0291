"""A script that reads its learning rate through `hpo.session()` and its width from a flag, and
never reads `momentum`: the worker must report momentum as never reaching it."""

import argparse
import math

import hpo

parser = argparse.ArgumentParser()
parser.add_argument("--width", type=int, required=True)
args = parser.parse_args()
s = hpo.session()
lr = s.params["learning_rate"]
for step in range(1, s.max_train_steps + 1):
    s.report(step, {"train/loss": math.exp(-lr * step) * 64 / args.width})
    if step % s.eval_every_steps == 0:
        s.report(step, {"valid/error_rate": 0.5 * math.exp(-lr * step)})
