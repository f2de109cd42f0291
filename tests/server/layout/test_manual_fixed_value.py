"""A manual trial may repeat a fixed hyperparameter's value (docs/spec.md, "Manual trials": "and
may repeat fixed values")."""

from __future__ import annotations

from hpo.server.layout.manual import manual_drafts
from hpo.server.spec.parse import parse_spec
from tests.server.factories import study_spec

TRIAL = {"params": {"optimizer": "adam", "learning_rate": 1e-3, "beta1": 0.9, "weight_decay": 1e-5, "batch_size": 128}}


def test_a_manual_trial_may_repeat_a_fixed_value() -> None:
    spec = parse_spec(study_spec(algorithm="manual", trials=[TRIAL]))  # accepted by the spec's checks
    drafts = manual_drafts(spec, [t.model_dump(exclude_none=True) for t in spec.trials or []])
    assert [d.params for d in drafts] == [{**TRIAL["params"]}]
