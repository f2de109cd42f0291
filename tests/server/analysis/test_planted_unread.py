"""An unread hyperparameter (docs/analysis.md, "Checks", `unread_hyperparameter`): a hyperparameter
the script never reads (or is never passed) trains every trial at the script's default, silently.
The worker reports such names when an attempt ends; the trial and the study's analysis must then say
so. Planted through the worker protocol on SQLite and Postgres."""

from __future__ import annotations

from typing import Any

import httpx

from tests.server.analysis import planted
from tests.server.analysis.protocol import API, Outcome, analysis, create, run_pending
from tests.server.analysis.test_planted import spec, unit_lr


def plant(unread: dict[int, list[str] | None]) -> Any:
    """Clean valley curves; trial number N reports `unread[N]` (missing: every name was read)."""

    def run(config: dict[str, Any]) -> Outcome:
        valid, train = planted.clean(config["number"], 0.1 + 0.3 * (unit_lr(config) - 0.5) ** 2)
        return Outcome({"valid/error_rate": valid, "train/loss": train}, unread_params=unread.get(config["number"], []))

    return run


def trials_of(client: httpx.Client, study_id: int) -> list[dict[str, Any]]:
    reply = client.get(f"{API}/studies/{study_id}/trials", params={"limit": 100})
    assert reply.status_code == 200, reply.text
    return list(reply.json()["items"])


def test_names_the_script_never_read_warn_on_the_trial_and_the_study(client: httpx.Client) -> None:
    study = create(client, spec("unread", num_trials=6))
    # Trials 0-3 never read weight_decay (varied); trial 1 also never read batch_size (fixed).
    run_pending(
        client,
        plant({0: ["weight_decay"], 1: ["batch_size", "weight_decay"], 2: ["weight_decay"], 3: ["weight_decay"]}),
    )
    by_number = {t["number"]: t for t in trials_of(client, study["id"])}
    assert by_number[1]["unread_params"] == ["batch_size", "weight_decay"]
    (warning,) = by_number[1]["warnings"]
    assert (
        warning["kind"] == "unread_hyperparameter"
        and "batch_size, weight_decay never reached the script" in warning["message"]
    )
    assert by_number[4]["unread_params"] == [] and by_number[4]["warnings"] == []

    result = analysis(client, study["id"])
    (unread,) = [w for w in result["warnings"] if w["kind"] == "unread_hyperparameter"]
    assert unread["params"] == {"weight_decay": 4, "batch_size": 1}, "varied names first, then by count"
    assert unread["trials"] == 4 and unread["trial_numbers"] == [0, 1, 2, 3]
    assert "weight_decay (4 trials), batch_size (1 trial)" in unread["message"]
    assert (
        "the study varies weight_decay" in unread["message"]
        and "batch_size" not in unread["message"].split("varies")[1]
    )


def test_a_study_whose_scripts_read_everything_has_no_such_warning(client: httpx.Client) -> None:
    study = create(client, spec("all-read", num_trials=4))
    run_pending(client, plant({}))
    assert "unread_hyperparameter" not in {w["kind"] for w in analysis(client, study["id"])["warnings"]}
    assert all(t["unread_params"] == [] for t in trials_of(client, study["id"]))


def test_unknown_names_are_dropped_and_bad_lists_are_422s_naming_the_field(client: httpx.Client) -> None:
    create(client, spec("unread-bad", num_trials=1))
    claim = client.post(f"{API}/workers/claim", json={"worker_id": "w", "resources": {"cpus": 4, "gpus": 0}}).json()
    tid, lease = claim["trial_id"], claim["lease_id"]
    for bad in ("weight_decay", [1], [""], ["x" * 101]):
        reply = client.post(f"{API}/trials/{tid}/complete", json={"lease_id": lease, "unread_params": bad})
        assert reply.status_code == 422, reply.text
        assert "unread_params" in reply.text
    reply = client.post(
        f"{API}/trials/{tid}/complete", json={"lease_id": lease, "unread_params": ["no_such", "weight_decay"]}
    )
    assert reply.status_code == 200, reply.text
    assert client.get(f"{API}/trials/{tid}").json()["unread_params"] == ["weight_decay"]
