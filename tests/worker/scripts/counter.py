"""A training script for the command tests (standard library only, so it starts in milliseconds).
Its "loss" is a pure function of (seed, step), so a resumed run must reproduce an uninterrupted one.
Behaviour on cue from params: `step_seconds`, `fail_at_step` (raises), `infeasible_at_step`,
`mode`: `silent` (never writes), `crash` (exits 3 at once), `orphan` (leaves a child behind),
`stubborn` (ignores SIGTERM), `quiet_exit` (exits 0 without a point), `keep_first` (checkpoints
are folders, and after each save the script deletes every checkpoint but its first and the one
just saved, as a framework's own retention such as Lightning's `save_top_k` would)."""

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpo.session import session

s = session()
p = s.params
mode = p.get("mode", "normal")
print(f"counter starting: params={p} resume_from={s.resume_from} argv={sys.argv[1:]}", flush=True)
if mode == "silent":
    time.sleep(3600)
if mode == "crash":
    print("loading data...\nValueError: the data folder is empty", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "quiet_exit":
    sys.exit(0)
if mode == "orphan":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    (s.out_dir / "orphan.pid").write_text(str(child.pid))
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def loss(seed: int, step: int) -> float:
    return 2.0 * math.exp(-step / 50) + random.Random(seed * 100_003 + step).random() * 0.01


def save(step: int) -> None:
    if mode == "keep_first":
        with s.checkpoint(step, "") as folder:
            folder.mkdir()
            (folder / "state.json").write_text(json.dumps({"step": step, "pid": os.getpid()}))
        for old in s.checkpoint_dir.glob("step-*"):
            if old.name not in (f"step-{every}", f"step-{step}"):
                shutil.rmtree(old)
        return
    with s.checkpoint(step, ".json") as path:
        path.write_text(json.dumps({"step": step, "pid": os.getpid()}))


def resumed_step() -> int:
    if not s.resume_from:
        return 0
    state = Path(s.resume_from)
    return int(json.loads((state / "state.json" if state.is_dir() else state).read_text())["step"])


every = s.eval_every_steps
start = resumed_step()
for step in range(start + 1, s.max_train_steps + 1):
    time.sleep(float(p.get("step_seconds", 0.0)))
    if p.get("fail_at_step") == step:
        raise RuntimeError(f"user code failed at step {step}")
    s.report(step, {"train/loss": loss(s.seed, step)})
    if p.get("infeasible_at_step") == step:
        s.infeasible(f"diverged at step {step}")
    if step % every == 0:
        s.report(step, {"valid/error_rate": loss(s.seed + 1, step)})
    if step % every == 0 or s.should_stop():
        save(step)
    if s.should_stop():
        sys.exit(0)
