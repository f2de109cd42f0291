"""Advice on a study's design, given when it is created: a tuned optimizer hyperparameter, enough
trials per tuned dimension (playbook FAQ, "How many trials are needed to get good results with
quasi-random search?"), Adam's hyperparameters worth tuning for the budget."""

from __future__ import annotations

from typing import Any

from hpo.server.spec.model import StudySpec, crossed_arms

OPTIMIZER_PARAMS = ("learning_rate", "momentum", "beta1", "beta2", "epsilon", "weight_decay")

# What scripts call them (argparse flags of public examples: `--lr`, `--wd`, `--eps`): a command
# study tuning `lr` tunes the learning rate, and is not told it tunes no optimizer hyperparameter.
SCRIPT_OPTIMIZER_PARAMS = (
    "lr",
    "base_lr",
    "max_lr",
    "wd",
    "eps",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "beta_1",
    "beta_2",
)

# The playbook's Adam rule (FAQ: 10 trials for 2 hyperparameters, 25 for 3) works out to about
# 8 trials per tuned dimension; fewer per arm and the best trial is mostly luck.
TRIALS_PER_DIMENSION = 8

ADAM_BUDGET = (("learning_rate",), ("learning_rate", "beta1"), ("learning_rate", "beta1", "epsilon"))


def design_warnings(spec: StudySpec) -> list[dict[str, Any]]:
    """Design checks answered at creation, never refusing the study (playbook, "Choosing the
    search spaces", "Batch size", and the Adam budget rule in the FAQ)."""
    tuned = {hp.name for hp in spec.hyperparameters if hp.role == "nuisance"}
    warnings: list[dict[str, Any]] = []
    known = {name.replace("-", "_").lower() for name in tuned}
    if spec.algorithm != "manual" and not known & {*OPTIMIZER_PARAMS, *SCRIPT_OPTIMIZER_PARAMS}:
        warnings.append(
            {
                "kind": "optimizer_all_fixed",
                "message": (
                    "No optimizer hyperparameter is tuned: conclusions hold only for these fixed values. The "
                    "playbook treats learning_rate (and momentum or Adam's betas) as nuisance hyperparameters "
                    "to tune in every study."
                ),
            }
        )
    if "batch_size" in tuned:
        warnings.append(
            {
                "kind": "batch_size_tuned",
                "param": "batch_size",
                "message": (
                    "batch_size is tuned as a nuisance hyperparameter. The playbook says to choose it for training "
                    "throughput, not validation performance: fix it and retune the optimizer hyperparameters instead."
                ),
            }
        )
    dims = max(len(_tuned_in_arm(spec, arm)) for arm in crossed_arms(spec))
    needed = TRIALS_PER_DIMENSION * dims
    if spec.algorithm in ("halton", "random") and spec.num_trials < needed:
        warnings.append(
            {
                "kind": "too_few_trials",
                "message": (
                    f"{spec.num_trials} trials per arm for {dims} tuned dimensions: below about {needed} trials "
                    "per arm quasi-random search leaves the best nuisance values to chance and the comparison "
                    "between arms unfair; raise num_trials or tune fewer nuisance hyperparameters."
                ),
            }
        )
    warnings += _adam_warnings(spec, tuned)
    warmup = spec.trainer.model_extra.get("warmup_steps") if spec.trainer.model_extra else None
    if isinstance(warmup, (int, float)) and warmup > 0.05 * spec.trainer.max_train_steps:
        warnings.append(
            {
                "kind": "long_warmup",
                "param": "warmup_steps",
                "message": (
                    f"warmup_steps={warmup} is over 5% of max_train_steps={spec.trainer.max_train_steps}; the playbook "
                    "suggests warmup of up to about 5% of training, longer warmup wastes steps."
                ),
            }
        )
    return warnings


def _tuned_in_arm(spec: StudySpec, arm: dict[str, Any]) -> set[str]:
    return {hp.name for hp in spec.hyperparameters if hp.varied and not hp.crossed and hp.holds(arm)}


def _adam_warnings(spec: StudySpec, tuned: set[str]) -> list[dict[str, Any]]:
    """The playbook's Adam rule: < 10 trials tune only the learning rate; 10-25 the learning
    rate and beta1; 25+ also epsilon (FAQ, "How should Adam's hyperparameters be tuned?")."""
    uses_adam = any("adam" in str(v).lower() for hp in spec.hyperparameters for v in (hp.values or [hp.value]))
    if not uses_adam:
        return []
    budget = ADAM_BUDGET[0] if spec.num_trials < 10 else ADAM_BUDGET[1] if spec.num_trials < 25 else ADAM_BUDGET[2]
    extra = sorted((tuned & {"beta1", "beta2", "epsilon"}) - set(budget))
    if not extra:
        return []
    return [
        {
            "kind": "adam_budget",
            "param": extra[0],
            "message": (
                f"Adam is tuned over {', '.join(extra)} with {spec.num_trials} trials per arm; with this budget the "
                f"playbook tunes only {', '.join(budget)} and fixes the rest."
            ),
        }
    ]
