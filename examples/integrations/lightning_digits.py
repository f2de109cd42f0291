"""A PyTorch Lightning script under hpo: `HpoCallback` reports what the module logs, writes the
checkpoints the worker records, resumes an earlier attempt and stops on SIGTERM with a checkpoint
(docs/scripts.md, "Framework callbacks"). Hyperparameters come in as flags
(lightning-digits.json: `--lr={learning_rate}`); the step budget and the output folder from
`hpo.session()`. scikit-learn's 8x8 digits: no download.

By hand: HPO_OUT_DIR=/tmp/run python lightning_digits.py --lr 0.1 --max-steps 120"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import lightning.pytorch as pl
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

import hpo
from hpo.integrations.lightning import HpoCallback, ckpt_path


class EpochShuffle(Sampler[int]):
    """A new order each epoch that is a function of (seed, epoch) (Lightning calls `set_epoch`), so a
    run resumed at an epoch's end trains on the batches an uninterrupted one does."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.size, generator=order).tolist())

    def __len__(self) -> int:
        return self.size


class Digits(pl.LightningModule):
    def __init__(self, lr: float, momentum: float, hidden: int) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)  # -> train/loss
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))  # -> valid/loss
        self.log("val_error_rate", (logits.argmax(1) != y).float().mean())  # -> valid/error_rate

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)


def loaders(batch_size: int, seed: int) -> tuple[DataLoader, DataLoader]:
    images, labels = load_digits(return_X_y=True)
    x, y = torch.tensor(images / 16.0, dtype=torch.float32), torch.tensor(labels)
    split = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))  # a fixed split
    train, valid = TensorDataset(x[split[:1500]], y[split[:1500]]), TensorDataset(x[split[1500:]], y[split[1500:]])
    train_loader = DataLoader(train, batch_size=batch_size, sampler=EpochShuffle(len(train), seed), drop_last=True)
    return train_loader, DataLoader(valid, batch_size=len(valid))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=None, help="default: the study's max_train_steps")
    args = parser.parse_args()
    s = hpo.session()
    pl.seed_everything(args.seed, verbose=False)
    train, valid = loaders(args.batch_size, args.seed)
    trainer = pl.Trainer(
        max_steps=args.max_steps or s.max_train_steps,
        max_epochs=-1,
        callbacks=[HpoCallback(infeasible_on_nan=True)],  # val_error_rate -> valid/error_rate by default
        default_root_dir=s.out_dir,
        logger=False,
        enable_checkpointing=False,  # the callback writes hpo's checkpoints
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(Digits(args.lr, args.momentum, args.hidden), train, valid, ckpt_path=ckpt_path())


if __name__ == "__main__":
    main()
