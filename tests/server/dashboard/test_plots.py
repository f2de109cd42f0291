"""Plot rendering on plain data, for every hyperparameter type and scale and for maximized objectives."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np

from hpo.server.analysis.model import TrialSummary
from hpo.server.analysis.rules.training import best_step_summary
from hpo.server.dashboard import plots
from hpo.server.space.search_space import dimensions

SPEC = {
    "hyperparameters": [
        {"name": "activation", "role": "nuisance", "type": "categorical", "values": ["relu", "gelu"]},
        {"name": "width", "role": "nuisance", "type": "discrete", "values": [64, 128, 256]},
        {"name": "layers", "role": "nuisance", "type": "int", "min": 1, "max": 8, "scale": "linear"},
        {"name": "momentum", "role": "nuisance", "type": "float", "min": 0.8, "max": 0.999, "scale": "reverse_log"},
        {"name": "learning_rate", "role": "nuisance", "type": "float", "min": 1e-4, "max": 1.0, "scale": "log"},
    ]
}


def _trials(n: int = 20) -> list[TrialSummary]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        params = {
            "activation": ["relu", "gelu"][i % 2],
            "width": [64, 128, 256][i % 3],
            "layers": int(1 + i % 8),
            "momentum": float(1 - 10 ** rng.uniform(-3, np.log10(0.2))),
            "learning_rate": float(10 ** rng.uniform(-4, 0)),
        }
        value = None if i % 7 == 0 else float(0.5 + 0.4 * rng.random())
        status = "infeasible" if value is None else "completed"
        out.append(TrialSummary(i + 1, i, {}, params, status, value, 100 * (1 + i % 20)))
    return out


def test_axis_plot_handles_every_type_and_scale_in_both_modes() -> None:
    for mode in ("min", "max"):
        data = {
            "study": "s",
            "metric": "valid/accuracy",
            "mode": mode,
            "dims": dimensions(SPEC),
            "trials": _trials(),
            "flagged": {("learning_rate", "max")},
        }
        svg = plots.render("axis", data, "svg")
        assert ET.fromstring(svg).tag.endswith("svg")
        assert svg.count(b"infeasible") >= 5 and b"best at max edge" in svg


def test_best_steps_and_empty_inputs_render() -> None:
    summary = best_step_summary(_trials(), 1.0, 2000)
    assert plots.render(
        "best_steps", {"study": "s", "metric": "m", "mode": "min", "summary": summary}, "png"
    ).startswith(b"\x89PNG")
    empty = {"study": "s", "metric": "m", "mode": "min"}
    for kind, extra in (
        ("axis", {"dims": [], "trials": [], "flagged": set()}),
        ("isolation", {"series": [], "arms": []}),
        ("curves", {"entries": [], "curves": {}, "checkpoints": {}}),
        ("grad_norm", {"entries": []}),
        ("best_steps", {"summary": {"max_train_steps": None, "best_step_fractions": [], "top": None, "advice": None}}),
        ("budget", {"series": []}),
    ):
        assert plots.render(kind, {**empty, **extra}, "svg").lstrip().startswith(b"<?xml")
