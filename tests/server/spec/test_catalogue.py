"""The server's catalogue of built-in workloads (server/spec/workloads.py): equal to the trainer's real
registry, and typos refused at creation with the valid names listed."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from hpo.policy import BUILTIN_WORKLOADS
from hpo.server.spec.parse import parse_spec
from hpo.server.spec.workloads import BUILTIN, CHOICES, workload_errors, workload_warnings
from tests.server.factories import study_spec


def test_catalogue_matches_the_trainer_registry() -> None:
    """Adding a built-in workload (or a hyperparameter, or a metric) to hpo.trainer.workloads
    without updating server/spec/workloads.py fails here, not in a user's study."""
    from hpo.trainer import workloads

    assert set(BUILTIN) == set(workloads.WORKLOADS) == set(BUILTIN_WORKLOADS)
    for name, entry in BUILTIN.items():
        real = workloads.load_workload(name)
        assert entry.model_params == tuple(real.hyperparameters), name
        if entry.metrics is None:  # a classifier: its per-class counts follow its class count
            assert entry.num_classes == real.num_classes, name
        assert entry.metric_names({}) == tuple(real.metric_names()), name
        if entry.num_classes_option:
            other = workloads.load_workload(name, {entry.num_classes_option: 3})
            assert entry.metric_names({entry.num_classes_option: 3}) == tuple(other.metric_names())
    assert CHOICES["activation"] == tuple(workloads.ACTIVATIONS)
    assert CHOICES["norm"] == workloads.NORMS


def test_the_server_side_does_not_import_torch() -> None:
    code = "import sys, hpo.server.spec.workloads, hpo.server.studies.service; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _errors(spec: dict[str, Any]) -> dict[str, str]:
    return {e.field: e.reason for e in workload_errors(parse_spec(spec))}


def test_the_example_spec_passes() -> None:
    assert _errors(study_spec()) == {}


def test_a_misspelled_hyperparameter_is_named_with_the_known_ones() -> None:
    spec = study_spec()
    spec["hyperparameters"][5]["name"] = "weight_decy"
    errors = _errors(spec)
    reason = errors["hyperparameters[5].name"]
    assert "'weight_decy'" in reason and "weight_decay" in reason and "width" in reason


def test_an_unknown_optimizer_value_and_objective_metric_are_refused() -> None:
    spec = study_spec(objective={"metric": "valid/error", "mode": "min"})
    spec["hyperparameters"][0]["values"] = ["nesterov", "adam", "adamm"]
    errors = _errors(spec)
    assert "'adamm'" in errors["hyperparameters[0].values"] and "adamw" in errors["hyperparameters[0].values"]
    assert "valid/error_rate" in errors["objective.metric"]


def test_metrics_follow_workload_options_and_train_eval() -> None:
    trainer = {"workload": "synthetic_mlp", "workload_options": {"num_classes": 3}}
    assert _errors(study_spec(objective={"metric": "valid/correct/class_2"}, trainer=trainer)) == {}
    assert "objective.metric" in _errors(study_spec(objective={"metric": "valid/correct/class_3"}, trainer=trainer))
    assert "objective.metric" in _errors(study_spec(objective={"metric": "train_eval/loss"}))
    with_train_eval = {"workload": "digits", "train_eval_examples": 256}
    assert _errors(study_spec(objective={"metric": "train_eval/loss"}, trainer=with_train_eval)) == {}


def test_a_user_workload_is_not_checked_but_warned_about() -> None:
    spec = parse_spec(study_spec(trainer={"workload": "mylab.models:Net"}, objective={"metric": "valid/bleu"}))
    assert workload_errors(spec) == []
    (warning,) = workload_warnings(spec)
    assert warning["kind"] == "unchecked_workload" and "valid/bleu" in warning["message"]
    assert workload_warnings(parse_spec(study_spec())) == []


def test_creation_answers_422_naming_the_field(client: Any) -> None:
    spec = study_spec(name="typo")
    spec["hyperparameters"][5]["name"] = "weight_decy"
    response = client.post("/api/v1/studies", json=spec)
    assert response.status_code == 422
    fields = [d["field"] for d in response.json()["detail"]]
    assert fields == ["hyperparameters[5].name"]
    assert client.get("/api/v1/studies").json()["total"] == 0
