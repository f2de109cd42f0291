"""`hpo study watch`: follows a study until its trials have finished.

On a terminal, rich redraws one block in place (at any width: every line is cut to the terminal,
so nothing wraps into stale copies): progress, ETA, the running trials, the best value, and a
warning when nothing has started or finished for a while. Not on a terminal (a pipe, a log), one
plain line is printed per change. Reads the study and the dashboard's progress endpoint."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from hpo.cli import CliError
from hpo.client import request
from hpo.tables import progress_line

STALL_SECONDS = 300.0


def watch(args: argparse.Namespace, console: Any = None) -> int:
    """Answers 0 once no trial is pending or running (or the study is paused or archived), 1 on
    --timeout. `console` (a rich Console) is for tests; by default stdout's."""
    from rich.console import Console
    from rich.live import Live

    console = console or Console(highlight=False)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    interval = max(args.interval, 0.05)
    if not console.is_terminal:
        return _plain(args, deadline, interval)
    with Live(console=console, auto_refresh=False, transient=False, redirect_stdout=False) as live:
        while True:
            study, progress = _poll(args)
            live.update(render(study, progress), refresh=True)
            if _done(study):
                return 0
            if deadline is not None and time.monotonic() >= deadline:
                live.console.print("[yellow]watch: timed out[/yellow]")
                return 1
            time.sleep(interval)


def _plain(args: argparse.Namespace, deadline: float | None, interval: float) -> int:
    last = ""
    while True:
        study, progress = _poll(args)
        line = summary_line(study, progress)
        if line != last:
            print(line, flush=True)
            last = line
        if _done(study):
            return 0
        if deadline is not None and time.monotonic() >= deadline:
            print("watch: timed out", file=sys.stderr)
            return 1
        time.sleep(interval)


def _poll(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any] | None]:
    study = request(args, "GET", f"/api/v1/studies/{args.study_id}")
    try:
        progress = request(args, "GET", f"/api/v1/studies/{args.study_id}/charts/progress")
    except CliError:  # an older server without the dashboard's endpoint: counts only
        progress = None
    return study, progress


def _done(study: dict[str, Any]) -> bool:
    counts = study["trial_counts"]
    return counts["pending"] + counts["running"] == 0 or study["status"] in ("paused", "archived")


def summary_line(study: dict[str, Any], progress: dict[str, Any] | None) -> str:
    """`name [status] [####....] 12/48 finished (3 running) best 0.1234 · ETA 14 min`."""
    line = f"{study['name']} [{study['status']}] " + progress_line(study["trial_counts"])
    if study.get("best_value") is not None:
        line += f" best {num(study['best_value'])}"
    eta = (progress or {}).get("eta_seconds")
    left = study["trial_counts"]["pending"] + study["trial_counts"]["running"]
    if left and eta is not None:
        line += f" · ETA {duration(eta)}"
    return line


def render(study: dict[str, Any], progress: dict[str, Any] | None) -> Any:
    """The block redrawn in place: one rich renderable, each line cut to the terminal's width."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    counts = study["trial_counts"]
    total = sum(counts.values())
    finished = sum(counts[s] for s in ("completed", "infeasible", "failed", "cancelled"))
    left = counts["pending"] + counts["running"]
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append(f"study {study['id']} {study['name']} ", style="bold")
    head.append(f"[{study['status']}]", style="cyan")
    if study.get("best_value") is not None:
        head.append(f"  best {study['objective']['metric']} = {num(study['best_value'])}")
        if study.get("best_trial_id") is not None:
            head.append(f" (trial {study['best_trial_id']})", style="dim")
    bar = Table.grid(padding=(0, 1), expand=True)
    bar.add_column(ratio=1, no_wrap=True)
    bar.add_column(no_wrap=True)
    bar.add_row(ProgressBar(total=max(total, 1), completed=finished), Text(f"{finished}/{total} finished"))
    detail = [f"{counts[s]} {s}" for s in ("running", "pending", "infeasible", "failed", "cancelled") if counts.get(s)]
    lines: list[Any] = [
        head,
        bar,
        Text(", ".join(detail) or "no trials", style="dim", no_wrap=True, overflow="ellipsis"),
    ]
    progress = progress or {}
    eta = progress.get("eta_seconds")
    if left:
        rate = progress.get("rate_per_hour")
        when = (
            f"ETA {duration(eta)} ({rate:.3g} trials/h)"
            if eta is not None and rate
            else "ETA unknown (no two recent finishes)"
        )
        lines.append(Text(when, no_wrap=True, overflow="ellipsis"))
    running = progress.get("running") or []
    if running:
        now = time.time()
        parts = [
            f"trial {r['id']}" + (f" {duration(now - r['started_at'])}" if r.get("started_at") else "")
            for r in running[:8]
        ]
        more = f" and {len(running) - 8} more" if len(running) > 8 else ""
        lines.append(Text("running: " + ", ".join(parts) + more, no_wrap=True, overflow="ellipsis"))
    idle = progress.get("idle_seconds")
    if (
        left
        and study["status"] == "active"
        and (progress.get("stalled") or (idle is not None and idle > STALL_SECONDS))
    ):
        since = "nothing has started yet" if idle is None else f"nothing has started or finished for {duration(idle)}"
        lines.append(
            Text(
                f"! {since}: is a worker running? (hpo worker --server ...)",
                style="bold yellow",
                no_wrap=True,
                overflow="ellipsis",
            )
        )
    if not left:
        lines.append(Text("all trials finished", style="green"))
    return Group(*lines)


def duration(seconds: float) -> str:
    s = round(max(seconds, 0.0))
    if s < 90:
        return f"{s} s"
    if s < 5400:
        return f"{round(s / 60)} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
