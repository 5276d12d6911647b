"""An unmodified Lightning script: no traceml import (zero-code tracing test).

    plain_lightning.py OUT_DIR [--callback] [--pl] [--accumulate K]

4 updates of a tiny model, validation every 2 updates, a checkpoint at the end of the epoch.
``--pl`` uses ``pytorch_lightning`` instead of ``lightning.pytorch``; ``--callback`` also adds
traceml's callback by hand (it must be traced once); ``--accumulate K`` accumulates gradients over K
batches per update (``accumulate_grad_batches``).
"""

import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

if "--pl" in sys.argv:
    import pytorch_lightning as L
else:
    import lightning.pytorch as L


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    accumulate = int(sys.argv[sys.argv.index("--accumulate") + 1]) if "--accumulate" in sys.argv else 1
    world = int(os.environ.get("WORLD_SIZE", "1"))
    data = TensorDataset(torch.randn(32 * accumulate * world, 8), torch.randn(32 * accumulate * world, 1))
    callbacks = []
    if "--callback" in sys.argv:
        from traceml_otel.integrations.lightning_callback import PLTraceMLCallback, TraceMLCallback

        callbacks.append(PLTraceMLCallback() if "--pl" in sys.argv else TraceMLCallback())
    trainer = L.Trainer(
        max_steps=4, limit_val_batches=2, val_check_interval=2 * accumulate, accelerator="cpu",
        accumulate_grad_batches=accumulate,
        devices=world, strategy="ddp" if world > 1 else "auto",
        default_root_dir=out, logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=1, callbacks=callbacks,
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=8))


if __name__ == "__main__":
    main()
