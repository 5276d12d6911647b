"""A one-process Hugging Face Trainer and an Accelerate ``prepare``, with no traceml line: prints, as
one JSON line, the code path each framework took (its wrapper of the model, its distributed mode)."""

import json
import sys

import torch
from accelerate import Accelerator
from torch import nn
from transformers import Trainer, TrainingArguments

torch.set_num_threads(1)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.layer(x).squeeze(-1)
        return {"loss": ((out - labels) ** 2).mean(), "logits": out}


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> dict:
        return {"x": torch.randn(4), "labels": torch.randn(())}


args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=8, max_steps=4, report_to=[],
                         use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True)
trainer = Trainer(model=Tiny(), args=args, train_dataset=Data())
trainer.train()
accelerator = Accelerator(cpu=True)
prepared = accelerator.prepare(nn.Linear(4, 1))
print(json.dumps({
    "trainer_wrapper": type(trainer.model_wrapped).__name__, "trainer_mode": str(args.parallel_mode),
    "trainer_world_size": args.world_size, "accelerate_type": str(accelerator.distributed_type),
    "accelerate_wrapper": type(prepared).__name__, "accelerate_processes": accelerator.num_processes,
}), flush=True)
