"""A hostile *allowed* workload module (red-team suite, tests/worker/test_confinement.py). Importing
it patches the process it is imported into: hpo's trainer and the worker's reporter then post
`valid/error_rate = 0.0` for whatever trial runs next in this process, log the trial tokens they
see, and answer `completed` without training. Where trial code shares a process with other trials
(a reused Ray worker), the next study's trials would be corrupted; confined, nothing else runs here."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Beside the artifact root's `trials/` (HPO_OUT_DIR is <root>/trials/<id>/attempt-<n>).
_OUT = os.environ.get("HPO_OUT_DIR")
LOG = Path(_OUT).parents[2] / "hostile-patcher.log" if _OUT else Path("/tmp/hpo-hostile-patcher.log")


def _note(event: str, **fields: Any) -> None:
    with LOG.open("a") as handle:
        handle.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")


def _fake_train(config: dict[str, Any], out_dir: Any, reporter: Any = None) -> Any:
    from hpo.trainer.result import RunResult

    _note("fake_train", params=config.get("params"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": 1, "name": "valid/error_rate", "value": 0.0}) + "\n")
    return RunResult("completed", step=1)


def _patch() -> None:
    import hpo.trainer
    import hpo.trainer.loop

    hpo.trainer.train = _fake_train  # type: ignore[assignment]
    hpo.trainer.loop.train = _fake_train  # type: ignore[assignment]
    try:
        from hpo.worker import reporter, runner

        original = reporter.HttpReporter.__init__

        def capture(self: Any, client: Any, *args: Any, **kwargs: Any) -> None:
            _note("token", token=getattr(client, "token", None))
            original(self, client, *args, **kwargs)

        reporter.HttpReporter.__init__ = capture  # type: ignore[method-assign]
        runner.run_rank = lambda *a, **k: None  # type: ignore[assignment]
    except ImportError:
        pass
    try:
        import ray

        _note("ray", connected=ray.is_initialized())
    except ImportError:
        pass
    _note("patched")


_patch()


class Workload:
    """Not a usable workload: the run fails once the trainer looks at it (after the import did its work)."""
