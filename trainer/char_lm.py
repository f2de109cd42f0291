"""`char_lm`: a character-level language model, the built-in workload that is not classification.

It trains on text shipped in the package (`data/pep20.txt`: PEP 20, the Zen of Python, public
domain), so it needs no download. Inputs are windows of `context` characters and labels the same
windows shifted by one; the model (embedding, one GRU layer, a linear read-out) answers logits
`[batch, context, vocabulary]`. The training loss is the per-window mean of the next-character
cross-entropy; evaluation sums token losses and token errors in float64 (all-reduced like every
workload's sums) and reports `loss`, `error_rate` (wrong next characters), `perplexity` and
`tokens`. The first 85 % of the text trains, the rest validates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from .errors import ConfigError

TEXT = Path(__file__).parent / "data" / "pep20.txt"


class CharModel(nn.Module):
    def __init__(self, vocabulary: int, embed_dim: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, embed_dim)
        self.rnn = nn.GRU(embed_dim, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocabulary)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(inputs))
        return self.out(hidden)  # type: ignore[no-any-return]


class CharLM:
    """The `Workload` protocol (hpo.trainer.workloads) for next-character prediction."""

    hyperparameters: Mapping[str, Any] = {"embed_dim": 32, "hidden": 128}

    def __init__(self, context: int = 32, valid_fraction: float = 0.15) -> None:
        if not 2 <= context <= 256:
            raise ConfigError(f"workload_options.context must be between 2 and 256, got {context}")
        self.text = TEXT.read_text(encoding="utf-8")
        self.alphabet = sorted(set(self.text))
        self.num_classes = len(self.alphabet)
        self.context = context
        self.valid_fraction = valid_fraction

    @property
    def chance_loss(self) -> float | None:
        return math.log(self.num_classes)

    def check_params(self, params: Mapping[str, Any]) -> None:
        for name in ("embed_dim", "hidden"):
            value = params[name]
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
                raise ConfigError(f"{name} must be an integer between 1 and 4096, got {value!r}")

    def build_model(self, params: Mapping[str, Any]) -> nn.Module:
        return CharModel(self.num_classes, int(params["embed_dim"]), int(params["hidden"]))

    def datasets(self) -> tuple[TensorDataset, TensorDataset]:
        index = {c: i for i, c in enumerate(self.alphabet)}
        ids = torch.tensor([index[c] for c in self.text], dtype=torch.int64)
        cut = int(len(ids) * (1 - self.valid_fraction))
        return self._windows(ids[:cut]), self._windows(ids[cut - self.context :])

    def _windows(self, ids: torch.Tensor) -> TensorDataset:
        starts = torch.arange(0, len(ids) - self.context)
        offsets = torch.arange(self.context)
        inputs = ids[starts[:, None] + offsets]
        return TensorDataset(inputs, ids[starts[:, None] + offsets + 1])

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        tokens = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", label_smoothing=label_smoothing)
        return tokens.mean(dim=1)

    def augment(
        self, inputs: torch.Tensor, labels: torch.Tensor, generator: torch.Generator, params: Mapping[str, Any]
    ) -> torch.Tensor:
        return inputs

    def eval_sums(self, logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        w = weights.to(torch.float64)
        losses = F.cross_entropy(logits.float().transpose(1, 2), labels, reduction="none").to(torch.float64)
        errors = (logits.argmax(dim=-1) != labels).to(torch.float64)
        return {
            "loss": (losses.sum(dim=1) * w).sum(),
            "errors": (errors.sum(dim=1) * w).sum(),
            "tokens": w.sum() * labels.shape[1],
        }

    def eval_metrics(self, sums: Mapping[str, torch.Tensor]) -> dict[str, float]:
        tokens = max(float(sums["tokens"]), 1.0)
        loss = float(sums["loss"]) / tokens
        return {
            "loss": loss,
            "error_rate": float(sums["errors"]) / tokens,
            "perplexity": math.exp(min(loss, 700.0)),
            "tokens": float(sums["tokens"]),
        }

    def metric_names(self) -> tuple[str, ...]:
        return ("loss", "error_rate", "perplexity", "tokens")
