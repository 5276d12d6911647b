"""Lightning with ``accumulate_grad_batches=2`` and a slow training dataset (3 ms per sample): the
second batch of each update is fetched inside the step. ``--callback`` adds traceml's callback by
hand (explicit); without it the script is unmodified (zero-code attaches the callback itself)."""

from __future__ import annotations

import argparse
import time

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, n: int) -> None:
        self.x, self.y = torch.randn(n, 32), torch.randn(n, 1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.003)
        return self.x[index], self.y[index]


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--callback", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    callbacks = []
    if args.callback:
        from traceml_otel.integrations.lightning_callback import TraceMLCallback

        callbacks.append(TraceMLCallback())
    trainer = L.Trainer(
        max_steps=args.updates, accelerator="cpu", accumulate_grad_batches=2, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=callbacks,
    )
    trainer.fit(Tiny(), DataLoader(Slow(args.updates * 2 * 4), batch_size=4))


if __name__ == "__main__":
    main()
