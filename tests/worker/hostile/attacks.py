"""Hostile *allowed* commands against the supervisor itself (red-team suite,
tests/worker/test_confinement.py), one per value of the trial's `attack` hyperparameter. Each
records what it managed in `$HPO_OUT_DIR/findings.json`; the test decides whether that was an
escape. Standard library only, so it runs under any Python the trial's user may execute.

- `links`: swaps the files the supervisor reads (stderr.log, result.json, params_read.json,
  metrics.jsonl) for links to the worker's token file, tries the worker's own folder and Ray's
  session folder, and exits 1 so the failure reason would quote stderr.
- `collector`: links metrics.jsonl to a root-only VICTIM, then prints points for the stdout
  collector, which once appended them through the link as root.
- `checkpoints`: makes `checkpoints` a link to another trial's sealed checkpoints and reports
  objective values, so retention would delete that trial's files.
- `hopper`: leaves a fork-and-exit hopper behind (hopper.py, with its safety valve).
- `limits`: forks sleeping children until refused, then allocates memory until killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def record(out_dir: Path, **found: object) -> None:
    path = out_dir / "findings.json"
    try:
        findings = json.loads(path.read_text())
    except (OSError, ValueError):
        findings = {}
    findings.update(found)
    path.write_text(json.dumps(findings))


def point(out_dir: Path, step: int, value: float) -> None:
    with (out_dir / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": step, "name": "valid/error_rate", "value": value}) + "\n")


def can(action: object) -> bool:
    try:
        action()  # type: ignore[operator]
        return True
    except OSError:
        return False


def links(out_dir: Path, params: dict) -> int:
    token = params["token_file"]
    worker_dir = out_dir.with_name(out_dir.name + ".worker")
    mine = out_dir / "mine"
    mine.write_text("x")
    record(
        out_dir,
        uid=os.getuid(),
        worker_dir_writable=can(lambda: (worker_dir / "planted").write_text("x")),
        worker_stderr_writable=can(lambda: (worker_dir / "stderr.log").open("a").close()),
        worker_stderr_replaced=can(lambda: os.replace(mine, worker_dir / "stderr.log")),
        ray_session_listed=can(lambda: os.listdir(params["ray_parent"])),
    )
    print("an honest line of stderr", file=sys.stderr, flush=True)
    for name in ("stderr.log", "result.json", "params_read.json", "metrics.jsonl"):
        os.symlink(token, out_dir / name)
    return 1


def collector(out_dir: Path, params: dict) -> int:
    os.symlink(params["victim"], out_dir / "metrics.jsonl")
    print("step=1 valid/error_rate=0.25", flush=True)
    time.sleep(1.0)  # the supervisor polls meanwhile
    return 0


def checkpoints(out_dir: Path, params: dict) -> int:
    os.symlink(params["victim_checkpoints"], out_dir / "checkpoints", target_is_directory=True)
    for step in range(1, 6):
        point(out_dir, step, 1.0 / step)
    time.sleep(1.0)
    return 0


def hopper(out_dir: Path, params: dict) -> int:
    script = Path(__file__).with_name("hopper.py")
    subprocess.run([sys.executable, str(script), params["beat"], "60"], check=True)
    while not os.path.exists(params["beat"]):
        time.sleep(0.01)
    point(out_dir, 1, 0.5)
    return 0


def limits(out_dir: Path, params: dict) -> int:
    forked = 0
    for _ in range(300):
        try:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
        except OSError:
            break
        forked += 1
    record(out_dir, forked=forked)
    point(out_dir, 1, 0.5)
    held = []
    for megabytes in range(64, 2048 + 1, 64):
        held.append(bytearray(64 * 1024 * 1024))
        record(out_dir, allocated_mb=megabytes)
    return 0


def main() -> int:
    out_dir = Path(os.environ["HPO_OUT_DIR"])
    params = json.loads(Path(os.environ["HPO_CONFIG"]).read_text())["params"]
    attack = {"links": links, "collector": collector, "checkpoints": checkpoints, "hopper": hopper, "limits": limits}
    return attack[params["attack"]](out_dir, params)


if __name__ == "__main__":
    sys.exit(main())
