"""The Docker files build what they say, checked statically (no Docker on the test machines): the
build context leaves out local state, the base image's torch satisfies the package's range, and
every compose service waits for the health of what it needs."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def _requirement(name: str) -> str:
    """The requirement string of `name` in pyproject's dependencies (tomllib is not in Python 3.10)."""
    quoted = re.findall(r'^\s*"([^"]+)",?\s*$', (REPO / "pyproject.toml").read_text(), flags=re.M)
    (found,) = [d for d in quoted if re.match(rf"{name}(\[|>|=|<|$)", d)]
    return found


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def test_dockerignore_leaves_out_local_state() -> None:
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "artifacts", ".hpo-demo", "build", "*.db"} <= ignored
    copied = re.findall(r"^COPY (\S+)", (REPO / "Dockerfile").read_text(), flags=re.M)
    assert copied and not any(c.rstrip("/") in ignored for c in copied), copied


def test_base_image_torch_satisfies_the_package_range() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    (image_torch,) = re.findall(r"^FROM pytorch/pytorch:(\d+\.\d+\.\d+)-", dockerfile, flags=re.M)
    minimum = re.search(r"torch>=(\d+\.\d+)", _requirement("torch"))
    assert minimum is not None
    assert _version(image_torch) >= _version(minimum.group(1))
    # The comment that explains why pip keeps the base image's torch names the same range.
    assert f"torch>={minimum.group(1)}" in dockerfile


def test_ray_is_pinned_to_a_range_that_includes_the_installed_version() -> None:
    import ray

    requirement = _requirement("ray")
    low = re.search(r">=([\d.]+)", requirement)
    high = re.search(r"<([\d.]+)", requirement)
    assert low and high, f"ray must be pinned to a tested range, got {requirement!r}"
    installed = _version(ray.__version__)
    assert _version(low.group(1)) <= installed < _version(high.group(1)), (requirement, ray.__version__)


def test_compose_services_wait_for_healthy_dependencies() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: depends_on must name a condition, not a bare list"
        for needed, rule in depends.items():
            # A long-running service must be healthy; a one-shot job (creating the worker token)
            # must have finished successfully.
            if rule == {"condition": "service_completed_successfully"}:
                assert "healthcheck" not in services[needed], f"{needed} runs for good, so wait for it to be healthy"
                continue
            assert rule == {"condition": "service_healthy"}, (name, needed, rule)
            assert "healthcheck" in services[needed], f"{name} waits for {needed}, which has no healthcheck"
    assert services["gpu-worker"]["depends_on"] == {"ray-head": {"condition": "service_healthy"}}
    environment = compose["x-hpo"]["environment"]
    assert environment["RAY_AUTH_MODE"] == "token" and "RAY_AUTH_TOKEN" in environment


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    """An editable install finds a package folder that `packages` leaves out, a built wheel does not:
    every folder with an `__init__.py` under the installed parts is listed, under its import name."""
    text = (REPO / "pyproject.toml").read_text()
    packages = re.search(r"^packages = \[(.*)\]$", text, flags=re.M)
    assert packages is not None
    listed = set(re.findall(r'"(hpo(?:\.\w+)*)"', packages.group(1)))
    roots = {"hpo": "hpo", "server": "hpo.server", "worker": "hpo.worker", "trainer": "hpo.trainer"}
    roots["migrations"] = "hpo.migrations"
    found = set()
    for folder, name in roots.items():
        for init in (REPO / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((name, *parts)))
    assert found - listed == set(), "package folders missing from pyproject.toml's packages"
    assert listed - found == set(), "pyproject.toml lists packages that have no folder"
