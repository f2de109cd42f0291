"""What one study spec costs the server to create: CPU seconds and peak memory of
`studies.create_study` for a spec of N float hyperparameters x T trials (the shape of a hostile
spec: a small body, a large layout), each size in a fresh process so peaks do not mix.

    .venv/bin/python bench/spec_cost.py                       # SQLite, the default sizes
    .venv/bin/python bench/spec_cost.py --sizes 1000x5000 --database-url postgresql+psycopg://...

Prints one line per size: cells (trials x hyperparameters), body bytes, CPU s, wall s, peak RSS
growth (MB) and the answer (201, or the 422 naming the limit)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any


def spec(floats: int, trials: int) -> dict[str, Any]:
    return {
        "name": f"cost-{floats}x{trials}",
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        "algorithm": "halton",
        "num_trials": trials,
        "seed": 0,
        "hyperparameters": [
            {"name": f"p{i}", "role": "nuisance", "type": "float", "min": 0.0, "max": 1.0} for i in range(floats)
        ],
        "trainer": {"command": ["python", "train.py"]},
    }


def one(floats: int, trials: int, database_url: str) -> dict[str, Any]:
    from hpo.policy import ExecutionPolicy
    from hpo.server.db import Database
    from hpo.server.errors import InvalidInput
    from hpo.server.studies import service as studies

    db = Database(database_url)
    db.upgrade()
    body = json.dumps(spec(floats, trials))
    policy = ExecutionPolicy(command_prefixes=(("python", "train.py"),))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        studies.create_study(db, json.loads(body), policy)
        answer = "201"
    except InvalidInput as exc:
        answer = f"422 {exc.errors[0].field}: {exc.errors[0].reason}"[:160]
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    db.dispose()
    return {
        "cells": floats * trials,
        "body_bytes": len(body),
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "peak_rss_growth_mb": round(peak / 1024, 1),
        "answer": answer,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100x1000,1000x1000,1000x5000", help="FLOATSxTRIALS, comma-separated")
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file per size")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        floats, trials = (int(x) for x in args.one.split("x"))
        print(json.dumps(one(floats, trials, args.database_url)))
        return
    for size in args.sizes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            url = args.database_url or f"sqlite:///{os.path.join(tmp, 'cost.db')}"
            out = subprocess.run(
                [sys.executable, __file__, "--one", size, "--database-url", url],
                capture_output=True,
                text=True,
                check=False,
            )
            line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr.strip()[-500:]
            print(f"{size:>12}  {line}", flush=True)


if __name__ == "__main__":
    main()
