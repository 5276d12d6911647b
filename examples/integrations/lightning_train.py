"""Lightning with step telemetry: a small MLP, random data, CPU (DDP over gloo with 2 processes).

    traceml run examples/integrations/lightning_train.py
    traceml run examples/integrations/lightning_train.py --nproc-per-node 2
    torchrun --nproc-per-node 2 examples/integrations/lightning_train.py   # direct launch works too

One ``traceml.step`` span per optimizer update; with ``--grad-accum k`` it holds the update's k
micro-batches (k forward and backward spans). ``--val-every N`` validates every N
batches and ``--save-every N`` checkpoints every N updates, between steps. ``--independent`` runs one
device per process without DDP (each process trains alone: ``traceml.parallelism = independent``).
``--package pytorch_lightning`` uses the older package name.
"""

from __future__ import annotations

import argparse
import importlib
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from traceml_otel.integrations.lightning_callback import callback_class


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=120, help="training batches")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--val-every", type=int, default=0, help="validate every N batches (0: never)")
    parser.add_argument("--package", default="lightning.pytorch",
                        choices=["lightning.pytorch", "pytorch_lightning"])
    parser.add_argument("--save-every", type=int, default=0, help="checkpoint every N updates (0: never)")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--independent", action="store_true",
                        help="one device per process, no DDP: N processes each train alone")
    args = parser.parse_args()
    L = importlib.import_module(args.package)  # Lightning's own naming convention

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                     nn.Linear(256, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self(x), y), sync_dist=True)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    world = 1 if args.independent else int(os.environ.get("WORLD_SIZE", "1"))
    n = args.steps * args.batch_size * world
    batch = args.batch_size
    train = DataLoader(TensorDataset(torch.randn(n, 64), torch.randint(0, 4, (n,))), batch_size=batch)
    val = DataLoader(TensorDataset(torch.randn(128, 64), torch.randint(0, 4, (128,))), batch_size=batch)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1 if args.independent else int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=1 if args.independent else max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))),
        strategy="ddp" if world > 1 else "auto",
        max_steps=args.steps // args.grad_accum,  # Lightning counts optimizer updates
        accumulate_grad_batches=args.grad_accum,
        val_check_interval=args.val_every or None,
        limit_val_batches=4 if args.val_every else 0,
        num_sanity_val_steps=0,
        enable_checkpointing=bool(args.save_every),
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=args.checkpoint_dir,
        callbacks=[
            callback_class(args.package)(),  # the one line that turns step telemetry on
            *([L.callbacks.ModelCheckpoint(every_n_train_steps=args.save_every, save_top_k=-1)]
              if args.save_every else []),
        ],
    )
    trainer.fit(Classifier(), train, val if args.val_every else None)


if __name__ == "__main__":
    main()
