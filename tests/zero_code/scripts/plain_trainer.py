"""An unmodified Hugging Face Trainer script: no traceml import (zero-code tracing test).

    plain_trainer.py OUT_DIR [--callback] [--subclass]

Tiny BERT from a config, 4 updates of 2 micro-batches, evaluation after update 2, a checkpoint after
update 3. ``--callback`` also adds traceml's callback by hand (it must be traced once);
``--subclass`` trains a Trainer subclass.
"""

import sys

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Tokens(Dataset):
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 64, (size, 16), generator=generator)
        self.labels = torch.randint(0, 2, (size,), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class MyTrainer(Trainer):
    pass


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)
    args = TrainingArguments(
        output_dir=out, max_steps=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=3, logging_steps=1,
        use_cpu=True, report_to=[], disable_tqdm=True, dataloader_num_workers=0,
    )
    callbacks = []
    if "--callback" in sys.argv:
        from traceml_otel.integrations.hf_trainer import TraceMLCallback

        callbacks.append(TraceMLCallback())
    cls = MyTrainer if "--subclass" in sys.argv else Trainer
    trainer = cls(model=BertForSequenceClassification(config), args=args, train_dataset=Tokens(64),
                  eval_dataset=Tokens(8), callbacks=callbacks)
    trainer.train()


if __name__ == "__main__":
    main()
