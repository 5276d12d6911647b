"""The Hugging Face Trainer with step telemetry: a tiny BERT built from a config (CPU, no downloads).

    traceml run examples/integrations/hf_trainer.py
    traceml run examples/integrations/hf_trainer.py --nproc-per-node 2      # DDP over gloo on CPU
    torchrun --nproc-per-node 2 examples/integrations/hf_trainer.py         # direct launch works too

One ``traceml.step`` span per optimizer update (``--grad-accum`` micro-batches folded in);
evaluation (``--eval-steps``) and checkpoints (``--save-steps``) run between steps, outside them.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from traceml_otel.integrations.hf_trainer import TraceMLCallback


class RandomTokens(Dataset):
    """Random token ids and labels: enough to train and time a step, nothing to download."""

    def __init__(self, size: int, length: int = 32, vocab: int = 128) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (size, length), generator=generator)
        self.labels = torch.randint(0, 2, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "attention_mask": torch.ones_like(self.ids[index]),
                "labels": self.labels[index]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40, help="optimizer updates")
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--eval-steps", type=int, default=0, help="evaluate every N updates (0: never)")
    parser.add_argument("--save-steps", type=int, default=0, help="checkpoint every N updates (0: never)")
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--no-use-cpu", action="store_true",
                        help="leave use_cpu off: on a machine without a GPU, N processes then train "
                             "independently (no DDP), as they do for a user who forgets it")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=64, num_labels=2)
    model = BertForSequenceClassification(config)  # weights initialised locally, nothing loaded
    samples = args.steps * args.grad_accum * args.batch_size
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="hf-trainer-")
    training = TrainingArguments(
        output_dir=output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=1e-4,
        eval_strategy="steps" if args.eval_steps else "no",
        eval_steps=args.eval_steps or None,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        logging_steps=10,
        use_cpu=not args.no_use_cpu,  # CPU, and gloo DDP when launched with several processes
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=RandomTokens(samples),
        eval_dataset=RandomTokens(4 * args.batch_size) if args.eval_steps else None,
        callbacks=[TraceMLCallback()],  # the one line that turns step telemetry on
    )
    trainer.train()


if __name__ == "__main__":
    main()
