"""Which Python frames a capture summary names: the user's, never torch's or traceml's own wrappers,
whether traceml is installed as a package or editable from a checkout (the README's setup)."""

from __future__ import annotations

import pytest

from traceml_otel.capture.capture_summary import _library


@pytest.mark.parametrize("name", [
    "/work/checkout/traceml_otel/capture/hooks.py(63): traceml_timed_backward",  # editable install
    "/venv/lib/python3.11/site-packages/traceml_otel/capture/optimizer_hooks.py(86): step",
    "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py(1750): _call_impl",
    "/src/pytorch/torch/optim/sgd.py(80): step",  # torch built from source
    "torch/nn/modules/module.py(1750): _call_impl",
    "<built-in method item of Tensor object at 0x7f>",
    "/usr/lib/python3.11/threading.py(300): wait",
])
def test_library_frames_are_skipped(name: str) -> None:
    assert _library(name)


@pytest.mark.parametrize("name", [
    "/home/user/project/train.py(88): train_step",
    "/home/user/project/models/torchish.py(10): forward",  # "torch" in a file name is not torch's
    "train.py(12): <module>",
])
def test_user_frames_are_kept(name: str) -> None:
    assert not _library(name)
