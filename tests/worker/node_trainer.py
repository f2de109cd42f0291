"""hpo.trainer's `train`, recording which Ray node each DDP rank ran on (`node-rank{R}.txt` in the
trial's folder), for the two-node cluster test."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def train(config: dict[str, Any], out_dir: Path, reporter: Any) -> Any:
    import ray

    from hpo.trainer import train as real_train

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    rank = os.environ.get("RANK", "0")
    (Path(out_dir) / f"node-rank{rank}.txt").write_text(ray.get_runtime_context().get_node_id())
    return real_train(config, out_dir, reporter)
