"""The files a user copies: every spec in examples/ is accepted by the server as it stands, the
README's curl examples run verbatim against a live server, and docker-compose.yml's services run
commands that the CLI (and `ray start`) accept."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from hpo.cli import build_parser
from tests.conftest import LiveServer
from tests.worker.conftest import API, REPO

EXAMPLES = sorted((REPO / "examples").glob("*.json"))
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_spec_is_accepted(client: httpx.Client, path: Path) -> None:
    response = client.post(f"{API}/studies", json=json.loads(path.read_text()))
    assert response.status_code == 201, response.text


def readme_curl_commands() -> list[str]:
    """`curl` command lines of the README's bash blocks, continuation lines joined."""
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        commands += [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip().startswith("curl")]
    return commands


def test_readme_curl_examples_run_verbatim(live_server: LiveServer, tmp_path: Path) -> None:
    commands = readme_curl_commands()
    (tmp_path / "examples").symlink_to(REPO / "examples")  # what they write lands here, not in the repo
    assert any("@examples/" in c for c in commands), "the README creates a study from examples/"
    for command in commands:
        for spec in re.findall(r"@(examples/\S+\.json)", command):
            assert (REPO / spec).is_file(), f"{spec} named by the README is missing"
        local = command.replace("localhost:8000", f"127.0.0.1:{live_server.port}")
        done = subprocess.run(["bash", "-c", local], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        try:
            answer = json.loads(done.stdout)
        except ValueError:
            continue  # a plot or CSV
        assert not (isinstance(answer, dict) and "detail" in answer), f"{command}: {done.stdout[:500]}"


def commands_of(service: dict[str, Any]) -> list[list[str]]:
    """The argv of each command a service runs (`bash -c "a && exec b"` gives two)."""
    command = service.get("command", [])
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if argv[:2] == ["bash", "-c"]:
        return [[w for w in shlex.split(part) if w != "exec"] for part in argv[2].split("&&")]
    return [argv]


def test_compose_has_the_services_the_readme_describes() -> None:
    services = COMPOSE["services"]
    assert {"postgres", "server", "ray-head", "gpu-worker"} <= set(services)
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in devices)
    for name in ("server", "tokens"):
        env = services[name]["environment"]
        assert env["HPO_DATABASE_URL"].startswith("postgresql+psycopg://") and "@postgres:" in env["HPO_DATABASE_URL"]
    for name in ("server", "ray-head", "gpu-worker"):
        env = services[name]["environment"]
        assert "artifacts:" + env["HPO_ARTIFACT_ROOT"] in services[name]["volumes"], "one shared artifact root"
    for name in ("ray-head", "gpu-worker"):  # trial code runs on Ray nodes: no secrets, no database
        env = services[name]["environment"]
        assert "HPO_DATABASE_URL" not in env and "HPO_API_TOKEN" not in env
        assert "backend" not in services[name]["networks"]
    assert all(p.startswith("127.0.0.1:") for p in services["ray-head"]["ports"]), "Ray dashboard on loopback"


def test_compose_commands_match_the_cli() -> None:
    from ray.scripts.scripts import start as ray_start

    seen = set()
    for name, service in COMPOSE["services"].items():
        for argv in commands_of(service) if "command" in service else []:
            if argv[0] == "hpo":
                args = build_parser().parse_args(argv[1:])  # argparse exits (a test error) on a bad option
                seen.add(args.command)
                if args.command == "worker":
                    assert args.server == [f"http://server:{_server_port()}"]  # --server repeats (several servers)
                    assert args.ray_address in ("auto", "ray-head:6379")
                    # trials as uids of their own, one per running trial (docs/security.md)
                    assert args.run_as and "-" in args.run_as and not args.unconfined, args
            elif argv[:2] == ["ray", "start"]:
                ray_start.make_context("start", argv[2:])  # click raises on an unknown option
                assert "--temp-dir=/var/lib/hpo-ray/ray" in argv, f"{name}: Ray's sockets below a root-only folder"
                seen.add(f"ray {'head' if '--head' in argv else 'node'}")
            else:
                pytest.fail(f"service {name} runs {argv[0]!r}, neither hpo nor ray")
    assert seen == {"server", "worker", "token", "ray head", "ray node"}
    assert "mkdir -m 0700 -p /var/lib/hpo-ray" in (REPO / "Dockerfile").read_text()


def _server_port() -> str:
    argv = commands_of(COMPOSE["services"]["server"])[0]
    port = argv[argv.index("--port") + 1]
    assert any(p.endswith(f":{port}:{port}") for p in COMPOSE["services"]["server"]["ports"])
    return port
