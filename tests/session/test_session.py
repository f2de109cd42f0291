"""`hpo.session()`, the helper for training scripts: standard library only, writes the file protocol
the worker reads (and nothing on ranks other than 0), answers SIGTERM through `should_stop()`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpo.session import Session
from hpo.worker.command import list_checkpoints, read_result
from hpo.worker.reporter import MetricsTail


def test_importing_the_helper_loads_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules)\n"
        "import hpo; s = hpo.session(); from hpo.session import session; assert session() is s\n"
        "std = set(sys.stdlib_module_names)\n"
        "new = set(sys.modules) - before - {'hpo', 'hpo.session'}\n"
        "print(sorted(m for m in new if m.split('.')[0] not in std))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPO_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def write_config(tmp_path: Path, **extra: object) -> dict[str, str]:
    config = {
        "params": {"learning_rate": 0.1},
        "seed": 5,
        "trainer": {"max_train_steps": 30, "eval_every_steps": 10},
        "objective": {"metric": "valid/error_rate", "mode": "min"},
        **extra,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return {"HPO_CONFIG": str(tmp_path / "config.json"), "HPO_OUT_DIR": str(tmp_path / "out")}


def test_reports_and_checkpoints_are_what_the_worker_reads(tmp_path: Path) -> None:
    s = Session(environ=write_config(tmp_path), handle_signals=False)
    assert (s.params, s.seed, s.max_train_steps, s.eval_every_steps, s.resume_from) == ({"learning_rate": 0.1}, 5, 30,
                                                                                           10, None)  # fmt: skip
    s.report(1, {"train/loss": 2.5, "train/grad_norm": float("nan")})
    s.report(2, {"train/loss": float("inf")})
    checkpoint = s.checkpoint(2)
    with checkpoint as path:
        path.write_bytes(b"state")
        assert list_checkpoints(s.checkpoint_dir) == {}, "not complete before the rename"
    assert list_checkpoints(s.checkpoint_dir) == {2: tmp_path / "out" / "checkpoints" / "step-2.pt"}
    with s.checkpoint(3, "") as folder:  # a folder checkpoint
        folder.mkdir()
        (folder / "model.bin").write_bytes(b"x")
    assert sorted(list_checkpoints(s.checkpoint_dir)) == [2, 3]
    points, _ = MetricsTail(tmp_path / "out" / "metrics.jsonl").read()
    assert [(p["step"], p["name"]) for p in points] == [(1, "train/loss"), (1, "train/grad_norm"), (2, "train/loss")]
    assert points[0]["value"] == 2.5 and points[1]["value"] != points[1]["value"] and points[2]["value"] == float("inf")


def test_a_failed_write_leaves_no_checkpoint(tmp_path: Path) -> None:
    s = Session(environ=write_config(tmp_path), handle_signals=False)
    with pytest.raises(RuntimeError), s.checkpoint(4) as path:
        path.write_bytes(b"half")
        raise RuntimeError("disk full")
    assert list(s.checkpoint_dir.iterdir()) == []


def test_only_rank_0_writes(tmp_path: Path) -> None:
    s = Session(environ={**write_config(tmp_path), "RANK": "1", "WORLD_SIZE": "2"}, handle_signals=False)
    assert not s.is_main and s.world_size == 2
    s.report(1, {"train/loss": 1.0})
    with s.checkpoint(1) as path:
        path.write_bytes(b"state")
    assert not (tmp_path / "out").exists()


def test_resume_from_and_its_step(tmp_path: Path) -> None:
    s = Session(environ=write_config(tmp_path, resume_from="/a/trials/1/attempt-1/checkpoints/step-40.pt"))
    assert (s.resume_from, s.resume_step) == ("/a/trials/1/attempt-1/checkpoints/step-40.pt", 40)


def test_infeasible_writes_result_json_and_exits(tmp_path: Path) -> None:
    s = Session(environ=write_config(tmp_path), handle_signals=False)
    with pytest.raises(SystemExit) as exit_:
        s.infeasible("loss NaN at step 7")
    assert exit_.value.code == 0
    assert read_result(tmp_path / "out" / "result.json") == ("infeasible", "loss NaN at step 7")


def test_sigterm_sets_should_stop_and_keeps_an_earlier_handler(tmp_path: Path) -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        s = Session(environ=write_config(tmp_path))
        assert not s.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert s.should_stop() and seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_by_hand_without_hpo_config(tmp_path: Path) -> None:
    s = Session(environ={}, out_dir=tmp_path / "run", handle_signals=False)
    assert (s.params, s.seed, s.resume_from, s.is_main) == ({}, 0, None, True)
    s.report(1, {"train/loss": 1.0})
    assert (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_framework_sets_the_rank_it_assigned(tmp_path: Path) -> None:
    """Lightning's own DDP launcher sets no `RANK`: the integrations tell the session the rank."""
    s = Session(environ=write_config(tmp_path), handle_signals=False)
    assert s.is_main
    s.set_rank(1, 2)
    assert (s.rank, s.world_size, s.is_main) == (1, 2, False)
    s.report(1, {"train/loss": 1.0})
    assert not (tmp_path / "out").exists()
    s.set_rank(0)
    assert s.is_main and s.world_size == 2


def test_params_note_which_names_the_script_reads() -> None:
    from hpo.session import Params

    def read_by(use: object) -> list[str]:
        params = Params(lr=0.1, momentum=0.9, width=64)
        use(params)  # type: ignore[operator]
        return sorted(params.read)

    everything = ["lr", "momentum", "width"]
    assert read_by(lambda p: p["lr"]) == ["lr"]
    assert read_by(lambda p: p.get("momentum", 0.0)) == ["momentum"]
    assert read_by(lambda p: ("lr" in p, list(p), len(p))) == [], "names alone are not values"
    assert read_by(lambda p: dict(p)) == everything
    assert read_by(lambda p: {**p}) == everything
    assert read_by(lambda p: argparse.Namespace(**p)) == everything
    assert read_by(lambda p: json.dumps(p)) == everything
    assert read_by(lambda p: [p[k] for k in p if k != "width"]) == ["lr", "momentum"]
    p = Params(lr=0.1, momentum=0.9)
    assert isinstance(p, dict) and p == {"lr": 0.1, "momentum": 0.9} and json.loads(json.dumps(p)) == dict(p)


def test_the_names_read_are_written_at_exit_for_the_worker(tmp_path: Path) -> None:
    env = {**os.environ, **write_config(tmp_path, params={"learning_rate": 0.1, "momentum": 0.9})}
    code = "import hpo; s = hpo.session(); lr = s.params['learning_rate']; s.report(1, {'train/loss': lr})"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / "out" / "params_read.json").read_text())
    assert written == {"read": ["learning_rate"], "unread": ["momentum"]}


def test_the_worker_reports_names_passed_by_no_placeholder_and_read_by_no_session(tmp_path: Path) -> None:
    from hpo.worker.command import unread_hyperparameters
    from hpo.worker.trial_tree import TrialTree

    tree = TrialTree.open(tmp_path)
    params = {"lr": 0.1, "momentum": 0.9, "width": 64}
    placeholders = {"params": params, "trainer": {"command": ["{python}", "train.py", "--lr={lr}"]}}
    plain = {"params": params, "trainer": {"command": ["{python}", "train.py"]}}
    assert unread_hyperparameters(tree, placeholders) == ["momentum", "width"]
    assert unread_hyperparameters(tree, plain) is None, "neither path in use: unknown"
    assert unread_hyperparameters(tree, {"params": params}) is None, "the built-in trainer checks its own names"
    (tmp_path / "params_read.json").write_text(json.dumps({"read": ["momentum", "not-a-param", 7]}))
    assert unread_hyperparameters(tree, placeholders) == ["width"]
    assert unread_hyperparameters(tree, plain) == ["lr", "width"]
    all_args = {"params": params, "trainer": {"command": ["{python}", "train.py", "{args}"]}}
    assert unread_hyperparameters(tree, all_args) == []
    (tmp_path / "params_read.json").write_text("[not json")
    assert unread_hyperparameters(tree, plain) is None
