"""INCOMPLETE_DATA: the step calls ``model.forward(x)`` directly, which bypasses the forward hook.

Without a forward time the analyzer cannot split the step into compute and the rest, so it says
what is missing instead of guessing (a missing forward is not a zero forward).

    traceml run examples/diagnosis/incomplete_data.py -- --steps 40
"""

from __future__ import annotations

from _common import mlp, parse_args, random_batches, train
from torch import nn
from torch.utils.data import DataLoader

import traceml_otel as traceml


def main() -> None:
    args = parse_args(__doc__)
    traceml.init(mode="auto")
    # Wide enough that the loader's ~50-70 us per fetch stays far below the 10 % input-bound share even
    # on a loaded machine: the verdict must come from the missing forward, not from the loader.
    model = mlp(hidden=1024)
    loader = DataLoader(random_batches(args.steps, args.batch_size), batch_size=None)
    loss_fn = nn.CrossEntropyLoss()
    # model.forward(x) instead of model(x): no __call__, so no forward hook fires.
    loss = train(loader, model, args.steps, compute_loss=lambda x, y: loss_fn(model.forward(x), y))
    print(f"incomplete_data: {args.steps} steps, final loss {loss:.3f}")


if __name__ == "__main__":
    main()
