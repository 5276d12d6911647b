"""Step telemetry for the Hugging Face ``Trainer``: one callback, one line to enable it.

    from traceml_otel.integrations.hf_trainer import TraceMLCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[TraceMLCallback()])

or ``instrument(trainer)`` on a trainer already built. The callback calls ``traceml.init()`` (mode
``auto``) unless the program did, and opens one ``traceml.step`` span per optimizer update: from
``on_step_begin`` (the first micro-batch of the update) to ``on_step_end`` (after the optimizer,
the scheduler and ``zero_grad``). With gradient accumulation the Trainer fetches all the update's
micro-batches before the first one runs, so their fetch time is the step's input wait and every
micro-batch's forward and backward is a child span (``traceml.phase.call`` 0..k-1). The step's
``traceml.step.samples`` is the configured work of an update on the rank
(``per_device_train_batch_size`` x ``gradient_accumulation_steps``).

Forward, backward and optimizer come from the automatic hooks: the model's outermost forward,
``accelerator.backward`` and the Trainer's ``AcceleratedOptimizer.step()``. Logging, evaluation and
checkpoints run after ``on_step_end``, outside every step span. While training, ``Trainer.evaluate``
and ``Trainer._save_checkpoint`` run inside ``traceml.outside_step("evaluation")`` /
``("checkpoint")``, so batches fetched for evaluation are not counted as the next step's input wait
(and fetches since the last step are dropped again at ``on_evaluate``/``on_save``, for a subclass
whose ``evaluate`` does not call ``Trainer.evaluate``).
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainerCallback

from traceml_otel.integrations._driver import StepDriver


class TraceMLCallback(TrainerCallback):
    """A ``TrainerCallback`` that traces each optimizer update as one ``traceml.step``.

    Args:
        **init_kwargs: passed to ``traceml.init()`` when the program has not called it.
    """

    def __init__(self, **init_kwargs: Any) -> None:
        self._driver = StepDriver(init_kwargs, source="hf_trainer")
        self._driver.start()  # before Trainer.train() prepares (and DDP-wraps) the model

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.start()
        self._driver.resumed_at(getattr(state, "global_step", 0))  # loaded from resume_from_checkpoint
        self._driver.forget_input_wait()
        self._driver.time_outside(Trainer, "evaluate", "evaluation")
        self._driver.time_outside(Trainer, "_save_checkpoint", "checkpoint")

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        # The update's work as configured: the loader's look-ahead fetch makes counting fetched
        # batches off by one micro-batch at the first update (a last partial batch is not seen).
        samples = _samples_per_update(args)
        self._driver.begin(model, samples=samples)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.end()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.forget_input_wait()

    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.forget_input_wait()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.forget_input_wait()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._driver.in_step:  # training stopped inside an update (max_steps, early stop)
            self._driver.end("IncompleteStep")
        self._driver.restore()


def _samples_per_update(args: Any) -> int | None:
    """Samples one rank trains on per optimizer update: batch size x accumulation steps."""
    batch = getattr(args, "per_device_train_batch_size", None)
    accumulation = getattr(args, "gradient_accumulation_steps", 1) or 1
    return batch * accumulation if isinstance(batch, int) and batch > 0 else None


def instrument(trainer: Any, **init_kwargs: Any) -> TraceMLCallback:
    """Add a :class:`TraceMLCallback` to ``trainer`` (one line); returns it."""
    callback = TraceMLCallback(**init_kwargs)
    trainer.add_callback(callback)
    return callback
