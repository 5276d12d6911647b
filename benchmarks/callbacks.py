"""Added time per optimizer update of the Trainer and Lightning callbacks, against the same loop without.

    .venv/bin/python benchmarks/callbacks.py                 # both frameworks, if installed
    .venv/bin/python benchmarks/callbacks.py --framework hf --rounds 5 --updates 30

One process per framework (``traceml.init()`` is once per process). Inside it, training blocks
alternate: bare (no TraceML callback, every hook uninstalled) and traced (the callback, hooks
installed, every step exported to the local copy by the emitter on the other core). Each block is
a full ``train()``/``fit()``; the time per update is measured from ``on_train_begin`` to
``on_train_end`` by a timing callback present in both. Medians over the rounds; the ratio is what
the callback adds. Torch runs on one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _toggle(on: bool) -> None:
    """Install or uninstall every automatic hook of the running telemetry."""
    from traceml_otel.capture.session import TrainingSession, current

    session = current()
    assert isinstance(session, TrainingSession)
    hooks = [*session.installed, session.forward]
    for hook in hooks if on else reversed(hooks):  # patches of one attribute nest: undo last first
        if hook is None:
            continue
        hook.install() if on else hook.uninstall()
    session._model = object()  # the next traced step hooks its model again (a benchmark-only reset)


def hf_blocks(rounds: int, updates: int, accum: int) -> dict[str, list[float]]:
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from traceml_otel.integrations.hf_trainer import TraceMLCallback

    class Timing(TrainerCallback):
        def on_train_begin(self, *args, **kwargs):
            self.started = time.perf_counter()

        def on_train_end(self, *args, **kwargs):
            self.seconds = time.perf_counter() - self.started

    class Tokens(torch.utils.data.Dataset):
        def __init__(self, size: int) -> None:
            self.ids = torch.randint(1, 128, (size, 32))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.ids[i], "attention_mask": torch.ones(32, dtype=torch.long),
                    "labels": torch.tensor(i % 2)}

    torch.manual_seed(0)
    config = BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=64)
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=updates, per_device_train_batch_size=8,
                             gradient_accumulation_steps=accum, use_cpu=True, report_to=[],
                             disable_tqdm=True, save_strategy="no", logging_steps=10_000)
    timing = Timing()
    trainer = Trainer(model=BertForSequenceClassification(config), args=args,
                      train_dataset=Tokens(updates * accum * 8), callbacks=[timing])
    traced = TraceMLCallback()  # starts telemetry
    results: dict[str, list[float]] = {"bare": [], "traced": []}
    trainer.train()  # warm-up
    for _ in range(rounds):
        for mode in ("bare", "traced"):
            _toggle(mode == "traced")
            if mode == "traced":
                trainer.add_callback(traced)
            trainer.train()
            if mode == "traced":
                trainer.remove_callback(traced)
            results[mode].append(timing.seconds / updates)
    return results


def lightning_blocks(rounds: int, updates: int, accum: int) -> dict[str, list[float]]:
    import lightning.pytorch as L  # Lightning's own naming convention
    import torch
    from torch import nn

    from traceml_otel.integrations.lightning_callback import TraceMLCallback

    class Timing(L.Callback):
        def on_train_start(self, trainer, module):
            self.started = time.perf_counter()

        def on_train_end(self, trainer, module):
            self.seconds = time.perf_counter() - self.started

    class Classifier(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                     nn.Linear(512, 4))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    n = updates * accum * 32
    data = torch.utils.data.TensorDataset(torch.randn(n, 64), torch.randint(0, 4, (n,)))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    module = Classifier()
    traced = TraceMLCallback()  # starts telemetry
    results: dict[str, list[float]] = {"bare": [], "traced": []}

    def fit(callbacks: list) -> float:
        timing = Timing()
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=updates, accumulate_grad_batches=accum,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[timing, *callbacks])
        trainer.fit(module, loader)
        return timing.seconds / updates

    fit([])  # warm-up
    for _ in range(rounds):
        _toggle(False)
        results["bare"].append(fit([]))
        _toggle(True)
        results["traced"].append(fit([traced]))
    return results


def child(framework: str, rounds: int, updates: int, accum: int) -> None:
    import torch

    torch.set_num_threads(1)
    blocks = hf_blocks if framework == "hf" else lightning_blocks
    print("RESULT " + json.dumps(blocks(rounds, updates, accum)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--framework", choices=["hf", "lightning", "all"], default="all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--accum", type=int, default=4)
    parser.add_argument("--child", choices=["hf", "lightning"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rounds, args.updates, args.accum)
        return
    names = {"hf": "HF Trainer callback", "lightning": "Lightning callback"}
    for framework in (["hf", "lightning"] if args.framework == "all" else [args.framework]):
        result = subprocess.run(
            [sys.executable, __file__, "--child", framework, "--rounds", str(args.rounds),
             "--updates", str(args.updates), "--accum", str(args.accum)],
            capture_output=True, text=True, check=False,
            env={**os.environ, "TRACEML_RUNS_DIR": tempfile.mkdtemp()},
        )
        line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{names[framework]}: failed or not installed\n{result.stderr[-2000:]}")
            continue
        data = json.loads(line[len("RESULT "):])
        bare, traced = statistics.median(data["bare"]), statistics.median(data["traced"])
        print(f"{names[framework]:<20} bare {bare * 1e3:8.2f} ms/update   "
              f"traced {traced * 1e3:8.2f} ms/update   "
              f"added {(traced - bare) * 1e6:+8.0f} us ({traced / bare - 1:+.1%}), "
              f"accumulation {args.accum}, {args.rounds} rounds")


if __name__ == "__main__":
    main()
