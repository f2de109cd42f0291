"""A Hugging Face `Trainer` script under hpo: `HpoTrainerCallback` reports what the Trainer logs,
makes its checkpoints the ones the worker records, resumes an earlier attempt and stops on SIGTERM
with a checkpoint (docs/scripts.md, "Framework callbacks"). Hyperparameters come in as flags
(hf-digits.json: `--learning-rate={learning_rate}`); the step budget and the output folder from
`hpo.session()`.

The model is a `PreTrainedModel` of its own, built from its config (no download): a small MLP on
scikit-learn's 8x8 digits. Any model the Trainer takes works the same way.

By hand: HPO_OUT_DIR=/tmp/run python hf_digits.py --learning-rate 0.3 --max-steps 60"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from transformers import EvalPrediction, PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments
from transformers.modeling_outputs import SequenceClassifierOutput

import hpo
from hpo.integrations.huggingface import HpoTrainerCallback, output_dir, resume_from_checkpoint


class DigitsConfig(PretrainedConfig):
    model_type = "hpo-digits-mlp"

    def __init__(self, hidden: int = 64, **kwargs: object) -> None:
        self.hidden = hidden
        super().__init__(**kwargs)


class DigitsMLP(PreTrainedModel):
    config_class = DigitsConfig

    def __init__(self, config: DigitsConfig) -> None:
        super().__init__(config)
        self.net = nn.Sequential(nn.Linear(64, config.hidden), nn.ReLU(), nn.Linear(config.hidden, 10))

    def forward(self, pixels: torch.Tensor, labels: torch.Tensor | None = None) -> SequenceClassifierOutput:
        logits = self.net(pixels)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


class Digits(torch.utils.data.Dataset):
    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.pixels = torch.tensor(images / 16.0, dtype=torch.float32)
        self.labels = torch.tensor(labels, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixels": self.pixels[i], "labels": self.labels[i]}


def datasets() -> tuple[Digits, Digits]:
    images, labels = load_digits(return_X_y=True)
    split = np.random.default_rng(0).permutation(len(labels))  # a fixed split
    train, valid = split[:1500], split[1500:]
    return Digits(images[train], labels[train]), Digits(images[valid], labels[valid])


def error_rate(prediction: EvalPrediction) -> dict[str, float]:
    logits, labels = np.asarray(prediction.predictions), np.asarray(prediction.label_ids)
    return {"error_rate": float((logits.argmax(-1) != labels).mean())}  # eval_error_rate -> valid/error_rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--learning-rate", type=float, default=0.3)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=None, help="default: the study's max_train_steps")
    args = parser.parse_args()
    s = hpo.session()
    torch.manual_seed(args.seed)
    model = DigitsMLP(DigitsConfig(hidden=args.hidden))
    train, valid = datasets()
    training = TrainingArguments(
        output_dir=output_dir(),  # $HPO_OUT_DIR/hf: the checkpoints become hard links in checkpoints/
        max_steps=args.max_steps or s.max_train_steps,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        optim="sgd",
        lr_scheduler_type="constant",
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=len(valid),
        eval_strategy="steps",
        eval_steps=s.eval_every_steps,
        save_strategy="steps",
        save_steps=s.eval_every_steps,
        save_total_limit=2,  # the Trainer deletes older ones; hpo sees them go
        logging_steps=1,
        logging_nan_inf_filter=False,  # a NaN loss shows, so the run ends infeasible
        seed=args.seed,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    callback = HpoTrainerCallback(infeasible_on_nan=True)
    trainer = Trainer(model, training, train_dataset=train, eval_dataset=valid, compute_metrics=error_rate,
                      callbacks=[callback])  # fmt: skip
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())


if __name__ == "__main__":
    main()
