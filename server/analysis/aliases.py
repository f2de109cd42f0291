"""A spec's `analysis.aliases` (docs/analysis.md, "Aliases"): the script's own names mapped onto the ones the
analysis reads (`spec.ANALYSIS_PARAMS`, `spec.ANALYSIS_METRICS`). The study and its trials are
renamed once, at load, so every check reads hpo's names as it does for the built-in trainer;
metric curves are queried by the script's name and filed under hpo's."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from hpo.server.analysis.model import StudyInfo, TrialSummary
from hpo.server.spec.model import ANALYSIS_METRICS, ANALYSIS_PARAMS

# The metrics the checks read: a trial page says in words when a trial reported none of one.
CHECKED_METRICS = ("train/loss", "train/grad_norm")


def aliases_of(spec: Mapping[str, Any]) -> dict[str, str]:
    """The spec's aliases, script name -> hpo name (empty without any)."""
    raw = ((spec.get("analysis") or {}).get("aliases")) or {}
    return {str(k): str(v) for k, v in raw.items()}


def metric_name(aliases: Mapping[str, str], name: str) -> str:
    """The name the script reports hpo's metric `name` under (itself without an alias)."""
    return next((k for k, v in aliases.items() if v == name and v in ANALYSIS_METRICS), name)


def param_name(aliases: Mapping[str, str], name: str) -> str:
    """The script's name of hpo's hyperparameter or trainer setting `name` (itself without an alias)."""
    return next((k for k, v in aliases.items() if v == name and v in ANALYSIS_PARAMS), name)


def setting(aliases: Mapping[str, str], name: str, params: Mapping[str, Any], spec: Mapping[str, Any]) -> Any:
    """hpo's hyperparameter or trainer setting `name` for one trial, read under the script's own
    name where aliased: the trial's params, else the study's trainer settings (None without)."""
    own = param_name(aliases, name)
    return params[own] if own in params else (spec.get("trainer") or {}).get(own)


def missing_metric(aliases: Mapping[str, str], name: str) -> dict[str, str]:
    """What a chart that needs metric `name` says when the study has none of it (docs/analysis.md, "Aliases"):
    `{name, reported_as, message}`, the message in words, pointing at `analysis.aliases` for the
    names the analysis reads."""
    own = metric_name(aliases, name)
    if own != name:
        message = f"no metric named {own} (the script's name for {name} in analysis.aliases) was reported"
    elif name in ANALYSIS_METRICS:
        message = f"no metric named {name}: alias your script's name in analysis.aliases (docs/analysis.md)"
    else:
        message = f"no metric named {name} in this study"
    return {"name": name, "reported_as": own, "message": message}


def filed(series: Mapping[str, Any], script: str, name: str) -> dict[str, Any]:
    """A trial's curves by name with the script's metric `script` filed under hpo's `name`."""
    out = dict(series)
    if script != name and script in out:
        out[name] = out.pop(script)
    return out


def _renamed(mapping: Mapping[str, Any], aliases: Mapping[str, str]) -> dict[str, Any]:
    return {aliases.get(k, k) if aliases.get(k) not in ANALYSIS_METRICS else k: v for k, v in mapping.items()}


def renamed_study(study: StudyInfo, aliases: Mapping[str, str]) -> StudyInfo:
    """The study with its hyperparameters (and their `when` keys) and trainer settings renamed."""
    if not aliases:
        return study
    spec = dict(study.spec)
    hps = []
    for hp in spec.get("hyperparameters") or []:
        hp = dict(hp)
        hp["name"] = _renamed({hp["name"]: None}, aliases).popitem()[0]
        if hp.get("when"):
            hp["when"] = _renamed(hp["when"], aliases)
        hps.append(hp)
    spec["hyperparameters"] = hps
    spec["trainer"] = _renamed(spec.get("trainer") or {}, aliases)
    return dataclasses.replace(study, spec=spec)


def renamed_trials(trials: Sequence[TrialSummary], aliases: Mapping[str, str]) -> list[TrialSummary]:
    """The trials with their params and arms renamed."""
    if not aliases:
        return list(trials)
    return [dataclasses.replace(t, params=_renamed(t.params, aliases), arm=_renamed(t.arm, aliases)) for t in trials]
