"""A user's traceback through a traced model's forward, backward, the optimizer or the DataLoader shows
one traceml frame, named for what it times (docs/architecture.md, "Our frames in your tracebacks")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys, torch, traceml_otel as traceml
traceml.init(mode="auto")
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
class Broken(torch.utils.data.Dataset):
    def __len__(self): return 4
    def __getitem__(self, index): raise KeyError("user bug in the dataset")
class Net(torch.nn.Module):  # a model class of the user's: timed by its class's call
    def forward(self, x): raise ValueError("user bug in the forward")
where = sys.argv[1]
if where == "forward":
    net = Net()
    with traceml.trace_step(net):
        net(torch.ones(1))
with traceml.trace_step(model):
    loss = model(torch.ones(3, 2)).sum()
    loss.backward()
    if where == "backward":
        loss.backward()  # through a freed graph
    if where == "optimizer":
        optimizer.step(lambda: 1 / 0)
if where == "loader":
    next(iter(torch.utils.data.DataLoader(Broken(), batch_size=2)))
"""


def test_each_failure_shows_one_clearly_named_traceml_frame(tmp_path: Path) -> None:
    script = tmp_path / "user.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEML_"))}
    env.update(TRACEML_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=str(REPO))
    expected = {"forward": "traceml_timed_forward", "backward": "traceml_timed_backward",
                "optimizer": "traceml_timed_optimizer_step", "loader": "traceml_timed_next"}
    runs = {where: subprocess.Popen([sys.executable, str(script), where], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True) for where in expected}  # side by side
    for where, name in expected.items():
        _, stderr = runs[where].communicate(timeout=120)
        assert runs[where].returncode == 1
        ours = [line for line in stderr.splitlines() if line.strip().startswith("File") and
                "traceml_otel" in line]
        assert len(ours) == 1 and ours[0].endswith(f"in {name}"), stderr
