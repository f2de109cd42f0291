"""The supervisor's ground rules, without a server: it never follows a path the trial controls
(worker/trial_tree.py), and an attempt ends whole, by its cgroup or its dedicated uid, however its
processes fork (worker/containment.py). The same escapes run end to end through a real worker in
test_confinement.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpo.worker import containment
from hpo.worker.containment import CgroupV1, Limits, ProcessTree, UidKill, alive_of_uid, contain
from hpo.worker.trial_tree import TrialTree, UnsafePath

HOPPER = Path(__file__).parent / "hostile" / "hopper.py"
SYSTEM_PYTHON = "/usr/bin/python3"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="cgroups and other uids need root (CI runs as root)")


# -- the attempt's folder -----------------------------------------------------------------------


def test_nothing_below_the_attempt_folder_is_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text('{"step": 1, "name": "stolen", "value": 1}\n')
    other = tmp_path / "other-trial" / "checkpoints"
    other.mkdir(parents=True)
    (other / "step-5.pt").write_text("someone else's checkpoint")
    attempt = tmp_path / "trials" / "1" / "attempt-1"
    with TrialTree.create(attempt) as tree:
        (attempt / "metrics.jsonl").symlink_to(secret)
        (attempt / "sub").symlink_to(tmp_path, target_is_directory=True)
        os.mkfifo(attempt / "result.json")
        assert tree.open_file("metrics.jsonl") is None, "a link to another file was opened"
        assert tree.open_file("result.json") is None, "a FIFO was opened (it would block the supervisor)"
        assert tree.open_file("sub/secret") is None, "a link to a folder was walked through"
        assert tree.open_dir("sub") is None
        for bad in ("../attempt-2", "/etc/passwd", "a/../../x"):
            with pytest.raises(UnsafePath):
                tree.open_file(bad)
        # A checkpoints folder that is a link to another trial's: nothing listed, nothing deleted.
        (attempt / "checkpoints").symlink_to(other, target_is_directory=True)
        assert tree.entries("checkpoints") == {}
        assert not tree.remove("checkpoints", "step-5.pt")
        assert (other / "step-5.pt").exists()
        # Inside a real folder: a link is removed as a link (never its target), a folder whole.
        (attempt / "checkpoints").unlink()
        (attempt / "checkpoints").mkdir()
        (attempt / "checkpoints" / "step-1.pt").symlink_to(other / "step-5.pt")
        (attempt / "checkpoints" / "step-2").mkdir()
        (attempt / "checkpoints" / "step-2" / "inner").symlink_to(other, target_is_directory=True)
        assert not tree.remove("checkpoints", "step-1.pt"), "a link is not a checkpoint"
        assert tree.remove("checkpoints", "step-2")
        assert (other / "step-5.pt").read_text() == "someone else's checkpoint"
        assert not (attempt / "checkpoints" / "step-2").exists()
        (attempt / "real.txt").write_text("mine")
        assert tree.read_bytes("real.txt") == b"mine"
    assert secret.read_text().startswith('{"step": 1')


def test_sealing_changes_only_what_it_opened(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    outside.chmod(0o600)
    attempt = tmp_path / "attempt-1"
    with TrialTree.create(attempt) as tree:
        (attempt / "checkpoints").mkdir()
        (attempt / "checkpoints" / "step-1.pt").write_text("w")
        (attempt / "link").symlink_to(outside)
        assert tree.seal(None) >= 3
    for path in (attempt, attempt / "checkpoints", attempt / "checkpoints" / "step-1.pt"):
        mode = path.stat().st_mode & 0o777
        assert not mode & 0o222 and mode & 0o444, (path, oct(mode))
    assert outside.stat().st_mode & 0o777 == 0o600, "sealing followed a link out of the folder"


@as_root
def test_sealing_leaves_a_hard_link_to_somebody_elses_file_alone(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.write_text("root's")
    precious.chmod(0o600)
    os.chown(precious, 0, 0)
    attempt = tmp_path / "attempt-1"
    with TrialTree.create(attempt) as tree:
        os.link(precious, attempt / "linked")
        tree.seal(20123)
    assert precious.stat().st_mode & 0o777 == 0o600, "a hard link made root's file world-readable"


# -- ending an attempt ------------------------------------------------------------------------


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder another uid may write (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="hpo-hopper-", dir="/tmp"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _beats(beat: Path) -> int:
    try:
        return len(beat.read_text().splitlines())
    except FileNotFoundError:
        return 0


def _start_hopper(folder: Path, setup: Callable[[], None], python: str = sys.executable) -> Path:
    beat = folder / "beat"
    script = folder / "hopper.py"  # where the trial's uid can read it (a checkout may be private to root)
    shutil.copy(HOPPER, script)
    script.chmod(0o644)
    subprocess.run([python, str(script), str(beat), "60"], preexec_fn=setup, check=True, timeout=30)
    deadline = time.monotonic() + 20
    while _beats(beat) < 3:
        assert time.monotonic() < deadline, "the hopper never hopped, so this test proves nothing"
        time.sleep(0.05)
    return beat


def _assert_stopped(beat: Path) -> None:
    time.sleep(0.3)
    before = _beats(beat)
    time.sleep(0.7)
    assert _beats(beat) == before, "something of the attempt still hops"


@as_root
@pytest.mark.skipif(not containment._v1_usable() and not containment._v2_usable(), reason="no writable cgroup")
def test_a_hopper_ends_with_its_attempts_cgroup(tmp_path: Path) -> None:
    group = contain(f"test-hopper-{os.getpid()}", Limits(processes=64), None)
    assert not isinstance(group, ProcessTree)
    beat = _start_hopper(tmp_path, group.join)
    try:
        group.end()
        _assert_stopped(beat)
    finally:
        (tmp_path / "stop").write_text("")


@as_root
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"the trial user's Python {SYSTEM_PYTHON}")
def test_a_hopper_ends_with_its_dedicated_uid(open_folder: Path) -> None:
    uid = 20_090
    # No subreaper here to reap each hop's parent, so their zombies (counted per uid) wait for init.
    group = UidKill(uid, Limits(processes=100_000))

    def as_trial() -> None:
        group.join()
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    beat = _start_hopper(open_folder, as_trial, SYSTEM_PYTHON)
    try:
        group.end()
        assert alive_of_uid(uid) == []
        _assert_stopped(beat)
    finally:
        (open_folder / "stop").write_text("")


FORKER = """
import os, sys, time
made = 0
for _ in range(300):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        made += 1
    except OSError:
        break
print(made, flush=True)
"""


@as_root
@pytest.mark.skipif(not containment._v1_usable() and not containment._v2_usable(), reason="no writable cgroup")
def test_an_attempts_processes_are_bounded(tmp_path: Path) -> None:
    group = contain(f"test-forker-{os.getpid()}", Limits(processes=20), None)
    assert isinstance(group, CgroupV1 | containment.CgroupV2)
    try:
        done = subprocess.run(
            [sys.executable, "-c", FORKER], preexec_fn=group.join, capture_output=True, text=True, timeout=60
        )
        assert 0 < int(done.stdout) < 20, done.stdout
    finally:
        group.end()


HOG = """
held = []
try:
    for _ in range(32):
        held.append(bytearray(32 * 1024 * 1024))
except MemoryError:
    print(len(held) * 32, flush=True)
"""


@as_root
@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f"the trial user's Python {SYSTEM_PYTHON}")
def test_without_a_cgroup_a_dedicated_uids_memory_is_bounded_per_process() -> None:
    uid = 20_091
    group = UidKill(uid, Limits(processes=64, memory_bytes=256 * 1024**2))

    def as_trial() -> None:
        group.join()
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", HOG], preexec_fn=as_trial, capture_output=True, text=True, timeout=60, cwd="/"
    )
    group.end()
    assert done.stdout.strip(), f"the hog was never refused memory: {done.stderr[-500:]}"
    assert int(done.stdout) < 256, done.stdout
