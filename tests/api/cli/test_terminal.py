"""The terminal: `hpo study watch` redraws one block in place with rich at any width (ETA,
running trials, a stall notice), and `hpo worker` prints one line per trial start and end."""

from __future__ import annotations

import argparse
import io
import logging
import re

import httpx
from rich.console import Console

from hpo.watch import render, watch
from hpo.worker.console import TrialLines, quiet_logging
from tests.conftest import LiveServer
from tests.server.analysis.protocol import create, run_one, run_pending
from tests.server.analysis.test_planted import spec, valley

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

STUDY = {
    "id": 7,
    "name": "a-study-with-a-rather-long-name-that-would-wrap-in-80-columns",
    "status": "active",
    "objective": {"metric": "valid/error_rate", "mode": "min"},
    "trial_counts": {"pending": 30, "running": 3, "completed": 11, "infeasible": 2, "failed": 1, "cancelled": 1},
    "best_value": 0.1234567,
    "best_trial_id": 12,
}
PROGRESS = {
    "eta_seconds": 1800.0,
    "rate_per_hour": 66.0,
    "idle_seconds": 900.0,
    "stalled": True,
    "running": [{"id": i, "started_at": None} for i in range(40, 43)],
}


def shown(width: int, renderable: object) -> list[str]:
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    console.print(renderable)
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def test_the_block_fits_any_width_and_says_what_matters() -> None:
    for width in (40, 80, 200):
        lines = shown(width, render(STUDY, PROGRESS))
        assert all(len(ANSI.sub("", line)) <= width for line in lines), (width, lines)
        assert len(lines) == 6, "one line each: head, bar, counts, ETA, running, stall"
    wide = "\n".join(shown(200, render(STUDY, PROGRESS)))
    assert "15/48 finished" in wide and "ETA 30 min" in wide and "running: trial 40, trial 41, trial 42" in wide
    assert "nothing has started or finished for 15 min: is a worker running?" in wide
    done = {**STUDY, "trial_counts": {**STUDY["trial_counts"], "pending": 0, "running": 0}}
    assert "all trials finished" in "\n".join(shown(80, render(done, {"running": []})))


def test_watch_redraws_in_place_on_a_terminal(live_server: LiveServer, client: httpx.Client) -> None:
    study = create(client, spec("watched-tty", num_trials=2))
    args = argparse.Namespace(study_id=study["id"], server=live_server.url, interval=0.05, timeout=0.4)
    console = Console(file=io.StringIO(), width=60, force_terminal=True, color_system=None)
    assert watch(args, console) == 1  # nothing runs: times out
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert out.count("\x1b[1A") >= 3, "later frames move the cursor up over the earlier one"
    assert "nothing has started yet: is a worker running?" in out
    assert all(len(ANSI.sub("", line)) <= 60 for line in out.splitlines())
    run_pending(client, valley(0.5))
    console = Console(file=io.StringIO(), width=60, force_terminal=True, color_system=None)
    assert watch(argparse.Namespace(**{**vars(args), "timeout": 10}), console) == 0
    assert "all trials finished" in console.file.getvalue()  # type: ignore[attr-defined]


def test_worker_lines_name_the_trial_and_its_objective(client: httpx.Client) -> None:
    create(client, spec("worker-lines", num_trials=1))
    out = io.StringIO()
    lines = TrialLines(out)
    claim = client.post("/api/v1/workers/claim", json={"worker_id": "w", "resources": {"cpus": 8, "gpus": 0}}).json()
    lines.started(claim)
    run_one(client, claim, valley(0.5))
    lines.finished(claim["trial_id"], _Client(client))
    first, last = out.getvalue().splitlines()
    assert first.startswith(f"trial {claim['trial_id']} started (study ") and "learning_rate=" in first
    assert re.match(rf"trial {claim['trial_id']} completed: valid/error_rate 0\.\d+ at step \d+ after \d+ s$", last)


class _Client:
    """ServerClient's `get` over the test's httpx client."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def get(self, path: str) -> dict:
        return dict(self.client.get(path).json())


def test_quiet_logging_silences_request_logs_unless_verbose() -> None:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), logging.getLogger("httpx").level, logging.getLogger("ray").level)
    try:
        quiet_logging(False)
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
        assert not logging.getLogger("ray").isEnabledFor(logging.WARNING)
        assert logging.getLogger("hpo.worker").isEnabledFor(logging.WARNING)
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        logging.getLogger("httpx").setLevel(saved[2])
        logging.getLogger("ray").setLevel(saved[3])
        logging.captureWarnings(False)
