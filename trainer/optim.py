"""Optimizers by the playbook's names (002, FAQ "What are the update rules for all the popular
optimization algorithms?"), built from torch's implementations:

| optimizer  | torch                        | hyperparameters                                        |
| ---------- | ---------------------------- | ------------------------------------------------------ |
| `sgd`      | SGD                          | learning_rate, weight_decay                            |
| `momentum` | SGD(momentum)                | learning_rate, momentum, weight_decay                  |
| `nesterov` | SGD(momentum, nesterov=True) | learning_rate, momentum, weight_decay                  |
| `adam`     | Adam                         | learning_rate, beta1, beta2, epsilon, weight_decay     |
| `adamw`    | AdamW (decoupled decay)      | learning_rate, beta1, beta2, epsilon, weight_decay     |
| `nadam`    | NAdam                        | learning_rate, beta1, beta2, epsilon, weight_decay     |
| `rmsprop`  | RMSprop (alpha = beta2)      | learning_rate, momentum, beta2, epsilon, weight_decay  |

torch's SGD momentum is the playbook's (`v = momentum * v + g`, no dampening). Known differences
from the playbook's table: torch's RMSProp starts its second moment at 0 (the playbook at 1) and adds
epsilon outside the square root; torch's NAdam applies its momentum-decay schedule (psi = 0.004).

Weight decay applies to weight matrices and other tensors of two or more dimensions only; biases
and normalization scales are not decayed (the usual practice, as in nanoGPT). The learning rate is
set by the loop at every step from `schedules.learning_rate`."""

from __future__ import annotations

import logging

import torch
from torch import nn

from .config import OPTIMIZER_HYPERPARAMETERS, TRAINING_HYPERPARAMETERS, Hyperparameters

_log = logging.getLogger("hpo.trainer")


def build_optimizer(model: nn.Module, h: Hyperparameters) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": h.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    if h.weight_decay == 0:
        # Nothing to split: one group (each group costs the optimizer a pass of Python per step).
        groups = [{"params": params, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    lr, betas, eps = h.learning_rate, (h.beta1, h.beta2), h.epsilon
    if h.optimizer in ("sgd", "momentum", "nesterov"):
        momentum = 0.0 if h.optimizer == "sgd" else h.momentum
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=h.optimizer == "nesterov")
    if h.optimizer == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=betas, eps=eps)
    if h.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
    if h.optimizer == "nadam":
        return torch.optim.NAdam(groups, lr=lr, betas=betas, eps=eps)
    if h.optimizer == "rmsprop":
        return torch.optim.RMSprop(groups, lr=lr, alpha=h.beta2, eps=eps, momentum=h.momentum)
    raise ValueError(f"unknown optimizer {h.optimizer!r}")  # parse_config already refused it


def unused_hyperparameters(h: Hyperparameters, given: set[str]) -> list[str]:
    """Optimizer hyperparameters set in `params` that the chosen optimizer does not read (for
    example `momentum` with `adam`): worth a warning, since a study may tune them for nothing."""
    optimizer_params = {name for names in OPTIMIZER_HYPERPARAMETERS.values() for name in names}
    used = set(OPTIMIZER_HYPERPARAMETERS[h.optimizer])
    return sorted(n for n in given if n in optimizer_params and n not in used and n in TRAINING_HYPERPARAMETERS)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
