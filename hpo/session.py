"""The helper for training scripts run as `trainer.command` (docs/scripts.md). Standard library only:
a script that imports it loads neither torch nor anything of hpo's server, worker or trainer.

    import hpo
    s = hpo.session()                       # or: from hpo.session import session
    lr = s.params["learning_rate"]
    start = 0
    if s.resume_from:                       # a checkpoint of an earlier attempt
        start = load(s.resume_from)         # your code: model, optimizer, data position
    for step in range(start + 1, s.max_train_steps + 1):
        ...
        s.report(step, {"train/loss": loss})
        if step % s.eval_every_steps == 0 or s.should_stop():
            s.report(step, {"valid/error_rate": err})
            with s.checkpoint(step, ".pt") as path:   # written to a temporary name, renamed on exit
                torch.save(state, path)
        if s.should_stop():                 # SIGTERM: a stop, a lost lease, a drained worker
            break

It writes the file protocol the worker reads: `{"step", "name", "value"}` lines appended to
`$HPO_OUT_DIR/metrics.jsonl`, checkpoints renamed into `$HPO_OUT_DIR/checkpoints/step-<N><ext>`,
`$HPO_OUT_DIR/result.json` for an infeasible point. Only rank 0 (the `RANK` variable) writes; the
other ranks' calls do nothing. Without `HPO_CONFIG` (a run by hand) the params are empty and the
files go to `$HPO_OUT_DIR`, else `./hpo-run`.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import re
import shutil
import signal
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

__all__ = ["Checkpoint", "Params", "Session", "session"]

_CHECKPOINT_STEP = re.compile(r"step-(\d+)")

# Written at exit: which hyperparameters the script read, so the worker can warn about the ones it
# never did (a name it ignores trains every trial at its own default, silently).
PARAMS_READ_FILE = "params_read.json"


class Params(dict):  # type: ignore[type-arg]
    """The trial's hyperparameters: a plain dict that notes which names the script reads.

    A name counts as read when it is looked up (`p["lr"]`, `p.get("lr")`, `pop`, `setdefault`) or
    when the whole mapping is taken (`items()`, `values()`, `copy()`, `dict(p)`, `**p`,
    `json.dumps(p)`, `vars`-style unpacking): the script may then use any of them. A test of
    membership (`"lr" in p`) or a look at the names alone (`list(p)`) reads no value."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, key: Any) -> Any:
        self.read.add(str(key))
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(str(key))
        return super().get(key, default)

    def pop(self, key: Any, *default: Any) -> Any:
        self.read.add(str(key))
        return super().pop(key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self.read.add(str(key))
        return super().setdefault(key, default)

    def _read_all(self) -> None:
        self.read.update(str(key) for key in dict.__iter__(self))

    def __iter__(self) -> Any:
        # Overridden so that dict(p), {**p} and f(**p) leave CPython's fast copy, which would go
        # around __getitem__, and read each value through it.
        return iter(list(dict.__iter__(self)))

    def items(self) -> Any:
        self._read_all()
        return super().items()

    def values(self) -> Any:
        self._read_all()
        return super().values()

    def copy(self) -> dict[str, Any]:
        self._read_all()
        return dict(super().items())

    def __or__(self, other: Any) -> Any:
        self._read_all()
        return dict(super().items()) | other

    def __reduce__(self) -> Any:  # pickling (multiprocessing, DataLoader workers) takes them all
        self._read_all()
        return (dict, (dict(super().items()),))

    def unread(self) -> list[str]:
        return sorted(name for name in dict.__iter__(self) if name not in self.read)


def _format(value: float) -> str:
    if math.isfinite(value):
        return repr(float(value))
    if math.isnan(value):
        return '"NaN"'
    return '"Infinity"' if value > 0 else '"-Infinity"'


class Checkpoint:
    """A checkpoint being written: write to `path` (a file, or a folder you create), then
    `commit()` renames it to `final`, where the worker sees it complete. As a context manager it
    commits on success and removes the partial write on an exception. `os.fspath(ckpt)` is `path`,
    so `torch.save(state, ckpt)` works too. On ranks other than 0 nothing is kept."""

    def __init__(self, final: Path, path: Path, keep: bool, before_commit: Any = None) -> None:
        self.final, self.path, self.keep = final, path, keep
        self._before_commit = before_commit
        self.committed = False

    def __fspath__(self) -> str:
        return str(self.path)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()

    def commit(self) -> Path:
        """Makes the checkpoint complete (an atomic rename); answers its final path."""
        if self.committed:
            return self.final
        if not self.keep:
            self.discard()
            return self.final
        if not self.path.exists():
            raise FileNotFoundError(f"nothing was written to {self.path}")
        if self._before_commit is not None:
            self._before_commit()  # the metrics file covers the checkpoint before it exists
        if self.path.is_file():
            with self.path.open("rb") as handle:
                os.fsync(handle.fileno())
        os.replace(self.path, self.final)
        self.committed = True
        return self.final

    def discard(self) -> None:
        if self.path.is_dir():
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            self.path.unlink(missing_ok=True)


class Session:
    """One run of a script under hpo. Attributes: `params` (every resolved hyperparameter), `seed`,
    `trainer` (the study's trainer settings), `objective` (`{"metric", "mode"}`), `resume_from`
    (a checkpoint path or None), `resume_step` (the step in its name), `out_dir`, `rank`,
    `world_size`, `is_main` (rank 0), `config` (the whole `HPO_CONFIG` object)."""

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        out_dir: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
        handle_signals: bool = True,
    ) -> None:
        env = os.environ if environ is None else environ
        if config is None:
            path = env.get("HPO_CONFIG")
            config = json.loads(Path(path).read_text()) if path else {}
        self.config: dict[str, Any] = dict(config)
        self.params: Params = Params(self.config.get("params") or {})
        self.seed: int = int(self.config.get("seed") or 0)
        self.trainer: dict[str, Any] = dict(self.config.get("trainer") or {})
        self.objective: dict[str, Any] = dict(self.config.get("objective") or {})
        resume = self.config.get("resume_from") or self.trainer.get("resume_from")
        self.resume_from: str | None = str(resume) if resume else None
        match = _CHECKPOINT_STEP.search(Path(self.resume_from).name) if self.resume_from else None
        self.resume_step: int | None = int(match.group(1)) if match else None
        self.out_dir = Path(out_dir or env.get("HPO_OUT_DIR") or "hpo-run")
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.is_main = self.rank == 0
        self._stop = False
        self._metrics: IO[str] | None = None
        self._names: dict[str, str] = {}
        if handle_signals:
            self._install_sigterm()
            atexit.register(self.write_params_read)

    def set_rank(self, rank: int, world_size: int | None = None) -> None:
        """The process's rank as a framework that starts its own processes assigns it (Lightning's
        DDP launcher sets no `RANK`): only rank 0 writes. `hpo.integrations` calls it."""
        self.rank = int(rank)
        if world_size is not None:
            self.world_size = int(world_size)
        self.is_main = self.rank == 0

    @property
    def max_train_steps(self) -> int:
        return int(self.trainer.get("max_train_steps", 1000))

    @property
    def eval_every_steps(self) -> int:
        return int(self.trainer.get("eval_every_steps", 100))

    @property
    def checkpoint_dir(self) -> Path:
        return self.out_dir / "checkpoints"

    # -- reporting -------------------------------------------------------------------------------

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        """Appends one point per metric (names such as `train/loss`, `valid/error_rate`); handed to
        the OS at once (no fsync: `checkpoint` makes them durable). NaN and infinities are data."""
        if not self.is_main:
            return
        if self._metrics is None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._metrics = (self.out_dir / "metrics.jsonl").open("a", encoding="utf-8")
        lines = []
        for name, value in metrics.items():
            quoted = self._names.get(name)
            if quoted is None:
                quoted = self._names[name] = json.dumps(str(name))
            lines.append(f'{{"step": {int(step)}, "name": {quoted}, "value": {_format(float(value))}}}\n')
        self._metrics.write("".join(lines))
        self._metrics.flush()

    def checkpoint(self, step: int, suffix: str = ".pt") -> Checkpoint:
        """Where to write the checkpoint of `step`: see `Checkpoint`. `suffix` is the file's
        extension (`.pt`), or "" for a folder."""
        if suffix and not re.fullmatch(r"(\.[A-Za-z0-9_-]+){1,3}", suffix):
            raise ValueError(f"suffix must look like '.pt' or '.tar.gz', got {suffix!r}")
        final = self.checkpoint_dir / f"step-{int(step)}{suffix}"
        if not self.is_main:
            scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"hpo-rank{self.rank}-{os.getpid()}{suffix}"
            return Checkpoint(final, scratch, keep=False)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        temporary = self.checkpoint_dir / f".step-{int(step)}{suffix}.tmp{os.getpid()}"
        return Checkpoint(final, temporary, keep=True, before_commit=self._sync_metrics)

    def _sync_metrics(self) -> None:
        if self._metrics is not None:
            self._metrics.flush()
            os.fsync(self._metrics.fileno())

    def infeasible(self, reason: str) -> None:
        """Ends the run as `infeasible` (diverged, out of memory: a property of the point, never
        retried): writes `result.json` and exits with status 0."""
        if self.is_main:
            self._sync_metrics()
            self.out_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.out_dir / "result.json.tmp"
            tmp.write_text(json.dumps({"status": "infeasible", "reason": str(reason)}))
            os.replace(tmp, self.out_dir / "result.json")
        raise SystemExit(0)

    # -- stopping --------------------------------------------------------------------------------

    def should_stop(self) -> bool:
        """True once SIGTERM arrived: checkpoint and exit (the trial is resumed later)."""
        return self._stop

    def request_stop(self) -> None:
        self._stop = True

    def _install_sigterm(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: Any) -> None:
            self._stop = True
            if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
                previous(signum, frame)

        signal.signal(signal.SIGTERM, on_sigterm)

    def close(self) -> None:
        if self._metrics is not None and not self._metrics.closed:
            self._sync_metrics()
            self._metrics.close()
        self.write_params_read()

    def write_params_read(self) -> None:
        """Writes `params_read.json` (`{"read": [...], "unread": [...]}`) for the worker, which
        reports the unread names as a warning on the trial and the study. Run at exit (and by
        `close`); only rank 0 writes, and only under hpo (with `HPO_CONFIG`)."""
        if not self.is_main or not self.config.get("params"):
            return
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.out_dir / f"{PARAMS_READ_FILE}.tmp"
            tmp.write_text(json.dumps({"read": sorted(self.params.read), "unread": self.params.unread()}))
            os.replace(tmp, self.out_dir / PARAMS_READ_FILE)
        except OSError:
            pass  # a read-only or vanished folder at exit: the warning is lost, not the run


_current: Session | None = None


def session(**overrides: Any) -> Session:
    """This process's `Session` (created at the first call; later calls answer the same one)."""
    global _current
    if _current is None or overrides:
        _current = Session(**overrides)
    return _current


class _CallableModule(types.ModuleType):
    """`hpo.session` is this module; calling it is calling `session()`, so both `hpo.session()`
    and `from hpo.session import session` work."""

    def __call__(self, **overrides: Any) -> Session:
        return session(**overrides)


sys.modules[__name__].__class__ = _CallableModule
