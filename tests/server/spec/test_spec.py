"""Spec validation without HTTP: every refusal names its field; good specs round-trip; design
warnings fire on the playbook's anti-patterns and stay quiet otherwise."""

from __future__ import annotations

import pytest

from hpo.server.errors import InvalidInput
from hpo.server.layout.manual import manual_drafts
from hpo.server.spec.advice import design_warnings
from hpo.server.spec.parse import parse_spec
from tests.server.factories import study_spec

SCI = {"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]}
LR = {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"}


def _fields(spec: dict) -> list[str]:
    with pytest.raises(InvalidInput) as caught:
        parse_spec(spec)
    return [e.field for e in caught.value.errors]


def test_the_design_example_round_trips() -> None:
    spec = parse_spec(study_spec())
    again = parse_spec(spec.model_dump(mode="json"))
    assert again == spec and again.trainer.max_train_steps == 2000


@pytest.mark.parametrize(
    "hyperparameters,field",
    [
        ([{**LR, "type": "int", "min": 1.5, "max": 4, "scale": "linear"}], "hyperparameters[0].min"),
        ([{"name": "w", "role": "nuisance", "type": "discrete", "values": [2, 1]}], "hyperparameters[0].values"),
        ([{"name": "w", "role": "nuisance", "type": "discrete", "values": [1, "x"]}], "hyperparameters[0].values"),
        ([{**SCI, "when": {"optimizer": ["sgd"]}}], "hyperparameters[0].when"),
        (
            [SCI, {**LR, "when": {"optimizer": ["sgd"]}}, {**LR, "when": {"optimizer": ["sgd", "adam"]}}],
            "hyperparameters[2].when",
        ),
        ([SCI, {**LR, "role": "fixed"}], "hyperparameters[1].value"),
        ([{**LR, "value": 0.1}], "hyperparameters[0].value"),
        ([{**LR, "name": "bad name!"}], "hyperparameters[0].name"),
        ([{**LR, "min": float("nan")}], "hyperparameters[0].min"),
        ([{**LR, "surprise": 1}], "hyperparameters[0].surprise"),
    ],
)
def test_refusals_name_the_field(hyperparameters: list[dict], field: str) -> None:
    assert field in _fields(study_spec(hyperparameters=hyperparameters))


def test_all_errors_are_reported_at_once() -> None:
    """Shape errors are all reported together, then (once the shape is right) all semantic ones."""
    shape = _fields(study_spec(num_trials=0, algorithm="bayes"))
    assert {"num_trials", "algorithm"} <= set(shape)
    meaning = _fields(study_spec(hyperparameters=[{**LR, "min": -1}, {**LR, "name": "m", "scale": "reverse_log"}]))
    assert {"hyperparameters[0].min", "hyperparameters[1].max"} <= set(meaning)


def test_grid_refuses_three_dimensions_and_manual_needs_trials() -> None:
    three = [{**LR, "name": n} for n in ("a", "b", "c")]
    assert "algorithm" in _fields(study_spec(algorithm="grid", hyperparameters=three))
    assert "trials" in _fields(study_spec(algorithm="manual"))
    assert "trials" in _fields(study_spec(trials=[{"params": {}}]))


def test_arms_times_trials_are_bounded() -> None:
    assert "num_trials" in _fields(study_spec(num_trials=60_000))  # two arms


def test_manual_trials_are_checked_against_their_arm() -> None:
    spec = parse_spec(study_spec(hyperparameters=[SCI, LR, {"name": "batch_size", "role": "fixed", "value": 8}]))
    drafts = manual_drafts(spec, [{"params": {"optimizer": "sgd", "learning_rate": 0.1}, "seed": 5}])
    assert drafts[0].params == {"optimizer": "sgd", "learning_rate": 0.1, "batch_size": 8} and drafts[0].seed == 5
    with pytest.raises(InvalidInput) as caught:
        manual_drafts(
            spec, [{"params": {"optimizer": "rmsprop", "learning_rate": 0.1}}, {"params": {"optimizer": "sgd"}}]
        )
    # One check for a manual trial, in the spec and when trials are added: it names the field at fault.
    assert {e.field for e in caught.value.errors} == {"trials[0].params.optimizer", "trials[1].params.learning_rate"}


def _kinds(**overrides: object) -> set[str]:
    return {w["kind"] for w in design_warnings(parse_spec(study_spec(**overrides)))}


def test_design_warnings() -> None:
    assert _kinds() == set()  # the design example is a sound study
    fixed_lr = [
        SCI,
        {"name": "learning_rate", "role": "fixed", "value": 0.1},
        {**LR, "name": "dropout", "scale": "linear", "min": 0.0},
    ]
    assert "optimizer_all_fixed" in _kinds(hyperparameters=fixed_lr)
    # A script's own name for the learning rate (`--lr`) is a tuned optimizer hyperparameter too.
    script_lr = [SCI, {**LR, "name": "lr"}, {**LR, "name": "dropout", "scale": "linear", "min": 0.0}]
    assert "optimizer_all_fixed" not in _kinds(hyperparameters=script_lr)
    bs = [LR, {"name": "batch_size", "role": "nuisance", "type": "discrete", "values": [32, 64]}]
    assert "batch_size_tuned" in _kinds(hyperparameters=bs)
    assert "too_few_trials" in _kinds(num_trials=5)
    adam = [
        SCI,
        LR,
        {"name": "epsilon", "role": "nuisance", "type": "float", "min": 1e-10, "max": 1e-6, "scale": "log"},
    ]
    assert "adam_budget" in _kinds(hyperparameters=adam, num_trials=20)
    assert "adam_budget" not in _kinds(hyperparameters=adam, num_trials=30)
    assert "long_warmup" in _kinds(trainer={"max_train_steps": 1000, "warmup_steps": 200})
