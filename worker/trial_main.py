"""`python -m hpo.worker.trial_main MODULE:FUNCTION`: one process of a workload trial.

The worker runs built-in and user workloads the way it runs a `trainer.command` (worker/command.py):
in a process started for this attempt alone, with the same files as its only channel. That keeps
a workload's code out of the Ray worker processes, which Ray reuses across trials and which hold a
connection to the cluster (docs/security.md). In: `HPO_CONFIG` (the claim's config, with
`resume_from`), `HPO_OUT_DIR`, and for DDP the `torchrun` variables, which the trainer reads. Out:
the trainer's own `metrics.jsonl` and `checkpoints/step-<N>.pt`, which the supervisor tails;
`result.json` saying `infeasible`, `config` or `error` (with the exception and its traceback) when
the run ended so; the exit status (0 completed, stopped or infeasible, 1 error, 3 config). SIGTERM
asks rank 0 to checkpoint and stop (the trainer broadcasts the stop to the other ranks, which
ignore the signal)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

RESULT_FILE = "result.json"
EXIT_ERROR, EXIT_CONFIG = 1, 3


class SignalStop:
    """The trainer's `Reporter` in a trial process: the supervisor tails the files, so points and
    checkpoints need no reporting; SIGTERM asks the run to stop."""

    def __init__(self) -> None:
        self.stop = False

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop = True

    def metrics(self, step: int, values: dict[str, float]) -> None:
        return None

    def checkpoint(self, step: int, path: str, objective_value: float | None) -> None:
        return None

    def should_stop(self) -> bool:
        return self.stop


def load_trainer(entry: str) -> tuple[Any, type[BaseException]]:
    """`module:function` → the train function and its module's `ConfigError` (or hpo.trainer's).
    The default is `hpo.trainer:train`; any function with that contract may stand in."""
    module_name, _, function = entry.partition(":")
    module = importlib.import_module(module_name)
    config_error = getattr(module, "ConfigError", None)
    if config_error is None:
        config_error = importlib.import_module("hpo.trainer").ConfigError
    return getattr(module, function or "train"), config_error


def write_result(out_dir: Path, status: str, reason: str, step: int | None) -> None:
    """`result.json` with `status` unless the trainer already wrote one that says so."""
    path = out_dir / RESULT_FILE
    try:
        if json.loads(path.read_text()).get("status") == status:
            return
    except (OSError, ValueError, AttributeError):
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"status": status, "reason": reason[:8000], "step": step}))
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    entry = argv[0] if argv else "hpo.trainer:train"
    config = json.loads(Path(os.environ["HPO_CONFIG"]).read_text())
    out_dir = Path(os.environ["HPO_OUT_DIR"])
    reporter = SignalStop()
    rank0 = os.environ.get("RANK", "0") == "0"
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, reporter.on_signal if rank0 else signal.SIG_IGN)
    train, config_error = load_trainer(entry)
    try:
        result = train(config, out_dir, reporter if rank0 else None)
    except config_error as exc:
        write_result(out_dir, "config", str(exc), None)
        print(f"config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    status = str(getattr(result, "status", "error"))
    reason = str(getattr(result, "reason", "") or "")
    step = getattr(result, "step", None)
    if not rank0 or status in ("completed", "stopped"):
        return 0
    if status in ("infeasible", "config"):
        write_result(out_dir, status, reason, step)
        return 0 if status == "infeasible" else EXIT_CONFIG
    reason = reason or f"the trainer answered status {status!r}"
    write_result(out_dir, "error", reason, step)
    print(reason, file=sys.stderr)
    return EXIT_ERROR


def describe(exc: BaseException) -> str:
    """The exception in one line, then its traceback, within the server's 20,000 characters."""
    summary = "".join(traceback.format_exception_only(exc)).strip()
    trace = "".join(traceback.format_exception(exc))
    return f"{summary[:2000]}\n\n{trace[-8000:]}"


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as exc:
        traceback.print_exc()
        with contextlib.suppress(Exception):
            write_result(Path(os.environ["HPO_OUT_DIR"]), "error", describe(exc), None)
        sys.exit(EXIT_ERROR)
