"""What `hpo worker` prints: one line when a trial starts and one when it ends, with the objective
it reached, and nothing else unless `-v` (see `quiet_logging`). Lines go to stdout; warnings and
errors from the worker's own logger still reach stderr."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

# Libraries that log every request or internal step at INFO (httpx: one line per HTTP request;
# Ray: placement-group cleaners, autoscaler, Train's setup), silenced unless -v.
NOISY_LOGGERS = ("httpx", "httpcore", "ray", "ray.train", "ray.tune", "ray.data", "urllib3", "filelock")


def quiet_logging(verbose: bool, level: str = "info") -> None:
    """-v: everything at `level` with timestamps. Otherwise warnings only, noisy libraries at
    ERROR, and Python warnings (DDP's among them) routed through logging at that level."""
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    if verbose:
        logging.basicConfig(level=level.upper(), format=fmt)
        return
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").setLevel(logging.ERROR)


class TrialLines:
    """Prints `started` / `finished` lines for the worker's trials."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self._started: dict[int, tuple[float, str]] = {}

    def started(self, claim: dict[str, Any]) -> None:
        trial_id = int(claim["trial_id"])
        metric = str((claim.get("config", {}).get("objective") or {}).get("metric") or "objective")
        self._started[trial_id] = (time.monotonic(), metric)
        params = ", ".join(f"{k}={_num(v)}" for k, v in (claim.get("config", {}).get("params") or {}).items())
        attempt = int(claim.get("attempt", 1))
        again = f", attempt {attempt}" if attempt > 1 else ""
        self._print(
            f"trial {trial_id} started (study {claim.get('study_id')}, no. {claim.get('number')}{again}): {params}"
        )

    def finished(self, trial_id: int, client: Any) -> None:
        """Asks the server how the trial ended (its status and best objective) and prints it."""
        began, metric = self._started.pop(trial_id, (time.monotonic(), "objective"))
        took = time.monotonic() - began
        try:
            trial = client.get(f"/api/v1/trials/{trial_id}")
        except Exception:  # the line is informative only; the server has the truth
            self._print(f"trial {trial_id} ended after {took:.0f} s")
            return
        status = trial.get("status", "?")
        value = trial.get("objective_value")
        what = f"{status}: {metric} {_num(value)} at step {trial.get('best_step')}" if value is not None else status
        if trial.get("error") and status != "completed":
            what += f" ({(trial.get('fail_kind') or 'error')}: {str(trial['error']).splitlines()[-1][:160]})"
        self._print(f"trial {trial_id} {what} after {took:.0f} s")

    def _print(self, line: str) -> None:
        print(line, file=self.out, flush=True)


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
