"""`hpo demo`: one whole study end to end on the embedded defaults (SQLite in the work folder, a
local Ray instance, a local artifact folder): it starts the server, creates the example study over
HTTP, runs every trial with the real trainer behind a progress bar, then prints the best trial of
each scientific value (the playbook's comparison with the nuisance hyperparameters optimized away)
and where to look next."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from hpo.settings import Settings

from .client import API, ProtocolError, ServerClient

DEFAULT_SPEC = "demo-study.json"


def examples_dir() -> Path:
    """`examples/` of the source tree this package runs from (an editable install or a clone)."""
    return Path(__file__).resolve().parent.parent / "examples"


def locate_spec(given: str | None) -> Path:
    from hpo.cli import CliError

    path = Path(given) if given else examples_dir() / DEFAULT_SPEC
    if not path.is_file():
        hint = "" if given else " (run from a clone with `pip install -e .`, or pass --spec FILE)"
        raise CliError(f"study spec {path} not found{hint}")
    return path


class EmbeddedServer:
    """The hpo server under uvicorn on a thread of this process."""

    def __init__(self, settings: Settings, port: int) -> None:
        import uvicorn

        from hpo.server.app import create_app

        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="hpo-server", daemon=True)

    def __enter__(self) -> EmbeddedServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the server did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def create_study(client: ServerClient, spec: dict[str, Any]) -> dict[str, Any]:
    """POSTs the spec; an earlier demo in the same folder keeps its study, this one gets a suffix."""
    for suffix in ["", *(f"-{i}" for i in range(2, 1000))]:
        try:
            return dict(client.post(f"{API}/studies", {**spec, "name": spec["name"] + suffix}))
        except ProtocolError as exc:
            if exc.status_code != 409:
                raise
    raise RuntimeError("no free study name")


class Progress:
    """A tqdm bar over the study's finished trials; as `until` for `Worker.run` it answers True
    once no trial is pending or running. Polls the server at most every `interval` seconds."""

    def __init__(self, client: ServerClient, study: dict[str, Any], interval: float = 0.5) -> None:
        from tqdm import tqdm

        self._client, self._study_id, self._interval = client, study["id"], interval
        self._bar = tqdm(total=sum(study["trial_counts"].values()), unit="trial", dynamic_ncols=True)
        self._next = 0.0
        self._done = False

    def __call__(self) -> bool:
        if self._done or time.monotonic() < self._next:
            return self._done
        self._next = time.monotonic() + self._interval
        try:
            study = self._client.get(f"{API}/studies/{self._study_id}")
        except Exception:  # a slow answer must not end the demo; the next poll tries again
            return False
        counts = study["trial_counts"]
        finished = sum(counts[k] for k in ("completed", "infeasible", "failed", "cancelled"))
        self._bar.n = finished
        best = study.get("best_value")
        self._bar.set_postfix(running=counts["running"], best="-" if best is None else f"{best:.4g}", refresh=False)
        self._bar.refresh()
        self._done = counts["pending"] + counts["running"] == 0 or study["status"] in ("paused", "archived")
        return self._done

    def close(self) -> None:
        self._bar.close()


def run_demo(args: argparse.Namespace) -> int:
    """The `hpo demo` command; see the module docstring."""
    from .loop import Worker, WorkerOptions

    workdir = Path(args.workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    spec = json.loads(locate_spec(args.spec).read_text())
    settings = Settings(
        database_url=f"sqlite:///{workdir / 'hpo.db'}",
        artifact_root=workdir / "artifacts",
        lease_seconds=float(os.environ.get("HPO_LEASE_SECONDS", 60)),
    )
    from .console import NOISY_LOGGERS, quiet_logging

    quiet_logging(False)
    started = time.monotonic()
    with EmbeddedServer(settings, args.port) as server:
        client = ServerClient(server.url)
        study = create_study(client, spec)
        print(_header(study, server.url, workdir))
        progress = Progress(client, study)
        if os.geteuid() == 0:
            print(
                "demo: running the built-in workloads as root, unconfined (its own throwaway server; docs/security.md)"
            )
        options = WorkerOptions(
            server_url=server.url,
            artifact_root=settings.artifact_root,
            num_cpus=args.num_cpus,
            log_to_driver=False,
            idle_poll_seconds=0.5,
            # Only the built-in workloads run, from this package, for a server it started itself.
            unconfined=True,
        )
        from tqdm.contrib.logging import logging_redirect_tqdm

        # Log lines (ours, Ray's, Python warnings) print above the bar through tqdm, never through it.
        loggers = [logging.root, *(logging.getLogger(name) for name in NOISY_LOGGERS), logging.getLogger("hpo")]
        worker = Worker(options, ServerClient(server.url))
        try:
            with logging_redirect_tqdm(loggers=loggers):
                worker.run(until=progress)
        finally:
            progress.close()
        print(summary(client, study["id"], workdir, time.monotonic() - started))
    if worker.stopped_by_signal == signal.SIGINT:
        from hpo.cli import Interrupted

        raise Interrupted(f"study {study['id']} and the trials that finished are kept in {workdir}")
    return 0


def _header(study: dict[str, Any], url: str, workdir: Path) -> str:
    counts = study["trial_counts"]
    arms = [h for h in study["spec"]["hyperparameters"] if h["role"] == "scientific"]
    lines = [
        f"hpo demo: study {study['id']} {study['name']!r} on {url} (SQLite and artifacts in {workdir})",
        f"  goal: {study['goal'] or study['description']}",
        f"  {sum(counts.values())} trials; scientific: {', '.join(h['name'] for h in arms) or '-'}; "
        f"objective: {study['objective']['metric']} ({study['objective']['mode']})",
    ]
    for warning in study.get("warnings", []):
        lines.append(f"  design check: {warning['message']}")
    return "\n".join(lines)


def summary(client: ServerClient, study_id: int, workdir: Path, seconds: float) -> str:
    """The best trial per scientific value, the analysis warnings when the server has them, and
    where to look next."""
    study = client.get(f"{API}/studies/{study_id}")
    trials = _all_trials(client, study_id)
    lines = [f"\nstudy {study_id} {study['status']} in {seconds:.0f} s: {_counts(study['trial_counts'])}", ""]
    lines += best_per_arm_table(study, trials)
    lines += _analysis_lines(client, study_id)
    lines += _next_steps(study, workdir)
    return "\n".join(lines)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {name}" for name, n in counts.items() if n)


def _all_trials(client: ServerClient, study_id: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    while True:
        page = client.get(
            f"{API}/studies/{study_id}/trials", {"order_by": "objective", "limit": 1000, "offset": len(items)}
        )
        items += page["items"]
        if not page["items"] or len(items) >= page["total"]:
            return items


def best_per_arm_table(study: dict[str, Any], trials: list[dict[str, Any]]) -> list[str]:
    """One line per arm: its best completed trial (trials come best first) and that trial's
    nuisance values, with how many trials of the arm completed or were infeasible."""
    scientific = {h["name"] for h in study["spec"]["hyperparameters"] if h["role"] == "scientific"}
    nuisance = sorted({h["name"] for h in study["spec"]["hyperparameters"] if h["role"] == "nuisance"})
    arms: dict[str, list[dict[str, Any]]] = {}
    for trial in trials:
        arms.setdefault(json.dumps(trial["arm"], sort_keys=True), []).append(trial)
    metric = study["objective"]["metric"]
    lines = [f"best {metric} ({study['objective']['mode']}) per {', '.join(sorted(scientific)) or 'study'}:"]
    for key, members in sorted(arms.items()):
        done = [t for t in members if t["status"] == "completed" and t["objective_value"] is not None]
        infeasible = sum(t["status"] == "infeasible" for t in members)
        label = ", ".join(f"{k}={v}" for k, v in json.loads(key).items()) or "all"
        if not done:
            lines.append(f"  {label:<28} no completed trial ({infeasible} infeasible)")
            continue
        best = done[0]
        tuned = ", ".join(f"{n}={_fmt(best['params'][n])}" for n in nuisance if n in best["params"])
        lines.append(
            f"  {label:<28} {_fmt(best['objective_value']):>10} at step {best['best_step']}  trial {best['id']}"
            f"  ({len(done)} completed, {infeasible} infeasible)  {tuned}"
        )
    return lines


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _analysis_lines(client: ServerClient, study_id: int) -> list[str]:
    try:
        analysis = client.get(f"{API}/studies/{study_id}/analysis")
    except Exception:  # the analysis endpoint is optional for the demo's table
        return []
    lines = [""] if analysis.get("warnings") else []
    for warning in analysis.get("warnings", [])[:8]:
        lines.append(f"  {warning.get('kind')}: {warning.get('message')}")
    return lines


def _next_steps(study: dict[str, Any], workdir: Path) -> list[str]:
    from hpo.cli import command_name

    sid, hpo = study["id"], command_name()
    db = f"sqlite:///{workdir / 'hpo.db'}"
    return [
        "",
        "where to look next:",
        f"  HPO_DATABASE_URL={db} {hpo} server --port 8000     # then open http://127.0.0.1:8000/",
        f"  {hpo} study analyze {sid} --server 127.0.0.1:8000      # the same checks in the terminal",
        f"  curl -s localhost:8000/api/v1/studies/{sid}/analysis         # boundary, curves, budget checks",
        f"  curl -s 'localhost:8000/api/v1/studies/{sid}/trials?order_by=objective&limit=5'",
        f"  curl -s localhost:8000/api/v1/studies/{sid}/plots/isolation > isolation.svg",
        f"  ls {workdir / 'artifacts' / 'trials'}      # metrics.jsonl and checkpoints of every attempt",
    ]
