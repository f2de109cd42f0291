"""A hostile *allowed* command (red-team suite, tests/worker/test_confinement.py): it tries every
escape the confinement must stop and writes what it managed into `$HPO_OUT_DIR/findings.json`,
then reports one metric point so the trial completes. Standard library only, so it runs under any
Python the trial's user may execute.

argv: findings are gathered on every run; with `--daemon VICTIM` it also leaves a double-forked,
`setsid` daemon behind that appends `0.0` points to VICTIM for as long as it lives."""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from pathlib import Path


def readable_environments() -> dict[str, str]:
    """Every /proc/<pid>/environ and cmdline this process can read (other processes' secrets)."""
    found = {}
    for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
        if path.startswith(f"/proc/{os.getpid()}/"):
            continue
        try:
            data = Path(path).read_bytes()
        except OSError:
            continue
        if data:
            found[path] = data.decode("utf-8", "replace")
    return found


def try_read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def try_writes(out_dir: Path) -> list[str]:
    """Writes into every other attempt folder of the artifact root: each success is an escape."""
    root = out_dir.parents[2]  # <root>/trials/<id>/attempt-<n>
    written = []
    for folder in root.glob("trials/*/attempt-*"):
        if folder.resolve() == out_dir.resolve():
            continue
        for target in (folder / "metrics.jsonl", folder / "planted.txt"):
            try:
                with target.open("a") as handle:
                    handle.write('{"step": 1, "name": "valid/error_rate", "value": 0.0}\n')
                written.append(str(target))
            except OSError:
                pass
    return written


def leave_daemon(victim: str, pid_file: Path) -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            pid_file.write_text(str(os.getpid()))
            while True:
                try:
                    with open(victim, "a") as handle:
                        handle.write('{"step": 1, "name": "valid/error_rate", "value": 0.0}\n')
                except OSError:
                    pass
                time.sleep(0.1)
        os._exit(0)
    os.wait()
    for _ in range(100):
        if pid_file.exists():
            return
        time.sleep(0.05)


def main() -> None:
    out_dir = Path(os.environ["HPO_OUT_DIR"])
    config = json.loads(Path(os.environ["HPO_CONFIG"]).read_text())
    options = config["params"]
    findings = {
        "uid": os.getuid(),
        "environment": dict(os.environ),
        "proc": readable_environments(),
        "token_file": try_read(str(options.get("token_file", ""))) if options.get("token_file") else None,
        "written": try_writes(out_dir),
    }
    (out_dir / "findings.json").write_text(json.dumps(findings))
    if "--daemon" in sys.argv:
        leave_daemon(sys.argv[sys.argv.index("--daemon") + 1], out_dir / "daemon.pid")
    with (out_dir / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": 1, "name": "valid/error_rate", "value": 0.5}) + "\n")


if __name__ == "__main__":
    main()
