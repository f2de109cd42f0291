"""`hpo train --nproc N`: N DDP processes on this machine, as `torchrun` would start them
(RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT), with gloo on CPU.

Rank 0 reports to the console and turns SIGINT / SIGTERM into a clean stop that it broadcasts to
the other ranks (which ignore those signals, so a Ctrl-C in the terminal stops the run once)."""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .reporters import ConsoleReporter, Reporter, record_stop_signal
from .result import RunResult


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_local(config: Mapping[str, Any], out_dir: Path, nproc: int, console: bool = True) -> RunResult:
    """Runs `train` in this process (`nproc == 1`) or in `nproc` spawned processes; answers rank
    0's result (read back from `out_dir/result.json`). `console` prints every evaluation."""
    if nproc == 1:
        from .loop import train

        reporter = ConsoleReporter() if console else ConsoleReporter(io.StringIO())
        reporter.install_signal_handlers()
        return train(config, out_dir, reporter)
    context = multiprocessing.get_context("spawn")
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(nproc)}
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        processes = [
            context.Process(target=_rank_main, args=(dict(config), str(out_dir), rank, env, console))
            for rank in range(nproc)
        ]
        for process in processes:
            process.start()
        signal.signal(signal.SIGTERM, lambda signum, frame: _forward(processes[0], signum))
        # Ctrl-C reaches rank 0 from the terminal; the parent only remembers it (for the exit status).
        signal.signal(signal.SIGINT, lambda signum, frame: record_stop_signal(signum))
        for process in processes:
            process.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    result_path = out_dir / "result.json"
    if processes[0].exitcode != 0 or not result_path.exists():
        codes = [p.exitcode for p in processes]
        return RunResult("error", f"a training process exited abnormally (exit codes {codes})")
    return RunResult.read(result_path)


def _forward(process: Any, signum: int) -> None:
    if process.pid is not None and process.is_alive():
        os.kill(process.pid, signum)


def _rank_main(config: dict[str, Any], out_dir: str, rank: int, env: dict[str, str], console: bool) -> None:
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
    reporter: Reporter | None = None
    if rank == 0:
        printer = ConsoleReporter() if console else ConsoleReporter(io.StringIO())
        printer.install_signal_handlers()
        reporter = printer
    else:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    from .loop import train

    train(config, Path(out_dir), reporter)
