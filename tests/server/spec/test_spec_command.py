"""`trainer.command` in the study spec: bounded, relative `workdir`, exactly one of workload and
command; refused with the field and the reason (422 over HTTP), and a command spec dumps to JSON
that parses again unchanged, with no workload."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import pytest

from hpo.policy import ExecutionPolicy
from hpo.server.errors import InvalidInput
from hpo.server.spec.parse import parse_spec
from hpo.settings import Settings
from tests.conftest import LiveServer
from tests.server.factories import study_spec

API = "/api/v1"


def spec(**trainer: Any) -> dict[str, Any]:
    return study_spec(name="script", trainer={"max_train_steps": 100, **trainer})


def test_a_command_spec_round_trips_without_a_workload() -> None:
    parsed = parse_spec(spec(command=["python", "train.py", "--epochs", "3"], workdir="lab/mnist"))
    dumped = parsed.model_dump(mode="json")
    assert dumped["trainer"]["command"] == ["python", "train.py", "--epochs", "3"]
    assert "workload" not in dumped["trainer"]
    assert parse_spec(dumped).model_dump(mode="json") == dumped


def test_a_workload_spec_dumps_no_command_settings() -> None:
    dumped = parse_spec(spec(workload="digits")).model_dump(mode="json")
    assert dumped["trainer"]["workload"] == "digits"
    assert not {"command", "workdir", "silence_timeout_seconds"} & set(dumped["trainer"])


BAD = {
    "empty command": ({"command": []}, "trainer.command"),
    "command as a string": ({"command": "python train.py"}, "trainer.command"),
    "too many arguments": ({"command": ["python"] * 257}, "trainer.command"),
    "argument too long": ({"command": ["python", "x" * 5000]}, "trainer.command[1]"),
    "empty program": ({"command": ["", "train.py"]}, "trainer.command[0]"),
    "NUL in an argument": ({"command": ["python", "a\x00b"]}, "trainer.command[1]"),
    "both workload and command": ({"command": ["python"], "workload": "digits"}, "trainer.workload"),
    "absolute workdir": ({"command": ["python"], "workdir": "/etc"}, "trainer.workdir"),
    "workdir climbing out": ({"command": ["python"], "workdir": "a/../../b"}, "trainer.workdir"),
    "workdir without command": ({"workdir": "a"}, "trainer.workdir"),
    "silence timeout without command": ({"silence_timeout_seconds": 10}, "trainer.silence_timeout_seconds"),
    "negative silence timeout": (
        {"command": ["python"], "silence_timeout_seconds": -1},
        "trainer.silence_timeout_seconds",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_command_settings_are_refused_naming_the_field(case: str) -> None:
    trainer, field = BAD[case]
    with pytest.raises(InvalidInput) as refused:
        parse_spec(spec(**trainer))
    assert field in [e.field for e in refused.value.errors], refused.value.errors


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_over_http_a_bad_workdir_is_a_422_naming_it(settings: Settings) -> None:
    allows = ExecutionPolicy(command_prefixes=(("python", "train.py"),))
    with (
        LiveServer(dataclasses.replace(settings, execution_policy=allows)) as live,
        httpx.Client(base_url=live.url, timeout=30) as client,
    ):
        _bad_and_good_workdir(client)


def _bad_and_good_workdir(client: httpx.Client) -> None:
    response = client.post(f"{API}/studies", json=spec(command=["python", "train.py"], workdir="../secrets"))
    assert response.status_code == 422
    assert "trainer.workdir" in response.text and "'..'" in response.text
    created = client.post(f"{API}/studies", json=spec(command=["python", "train.py"], workdir="lab"))
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["trainer"]["command"] == ["python", "train.py"]


def test_command_settings_on_a_workload_study_are_refused() -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_spec(spec(workload="synthetic_mlp", workdir="lab", env={"DATA_DIR": "/data"}))
    fields = {e.field: e.reason for e in refused.value.errors}
    only = "applies only to trainer.command"
    assert fields == {"trainer.workdir": only, "trainer.env": only}
