"""Which loader is the training loader: only its fetches between steps are training input wait.

A fetch between steps is tagged with its *source*: the ``id`` of the dataset behind the DataLoader
iterator (a new iterator of the same loader, each epoch, has the same source; a loader the user
wrapped with ``wrap_dataloader`` has ``None``: declared training). The rule, the same in explicit and
zero-code mode:

- a source is **training** once a step begins fed by its batch (its fetch is pending when the step
  opens, with no forward between steps since): the batches that feed the step's forward;
- a source is **evaluation** once a model's forward runs between steps after its fetch (a validation
  loop, under ``no_grad``/``eval()`` or not: a forward outside every step trains nothing);
- a fetch from a source not yet known as training is held apart (:class:`TrainingLoader`): a step
  that begins takes it as input wait (and learns its source as training: the first step, two loaders
  zipped, a new training loader), a forward between steps drops it (its time stays between steps);
- under step inference a forward with gradients enabled whose batch came from an evaluation source
  opens no step (:meth:`TrainingLoader.last_batch`): a validation loop that forgot
  ``torch.no_grad()`` is evaluation, not a step. One whose batch came from a loader never seen
  before opens a *tentative* step: a new training loader's batch is followed by a backward; if the
  step instead fetches again before any backward (the next validation batch, or the training loader's
  next one), the step is cancelled and the loader is evaluation's
  (:meth:`~traceml_otel.capture.recorder.StepRecorder.open_tentatively`).

On the training thread a fetch from a training source costs one set lookup more than before; fetches
from other sources take a method call here. Fetches never taken as input wait are counted
(``dropped_fetches``) and their time stays in the time account's between-steps part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_SOURCES = 256
"""Loaders remembered as training or as evaluation, each (forgotten all at once beyond it)."""


@dataclass(slots=True)
class _Held:
    """The fetches of one source held since the last step or forward between steps."""

    wait_ns: int = 0
    fetches: int = 0
    samples: int | None = None


@dataclass(slots=True)
class TrainingLoader:
    """The training and evaluation sources of one recorder, and the fetches held apart (see above)."""

    training: set[Any] = field(default_factory=set)
    """Sources known as training (shared with the recorder's hot path, which reads it inline)."""
    evaluation: set[Any] = field(default_factory=set)
    held: dict[Any, _Held] = field(default_factory=dict)
    last: Any = None
    """The source of the last fetch between steps when it was held (``None``: a training source's)."""
    dropped_fetches: int = 0
    """Fetches between steps from other loaders, never any step's input wait."""

    def hold(self, source: Any, wait_ns: int, samples: int | None, fetched: bool) -> bool:
        """A fetch between steps from a source not known as training; returns whether the next step
        may start at its end (step inference), i.e. the source is not known as evaluation."""
        held = self.held.get(source)
        if held is None:
            held = self.held[source] = _Held()
        held.wait_ns += wait_ns
        held.fetches += 1
        if not fetched:  # an exhausted iterator's last call: no batch, nothing it feeds
            return False
        if samples is not None:
            held.samples = samples
        self.last = source
        return source not in self.evaluation

    def last_batch(self) -> str | None:
        """Whose batch a forward between steps would use now: ``None`` (the training loader's, or
        no training loader is known yet), ``"evaluation"`` (a loader known as evaluation's) or
        ``"unknown"`` (a loader neither known as training nor as evaluation)."""
        last = self.last
        if last is None or not self.training:
            return None
        return "evaluation" if last in self.evaluation else "unknown"

    def not_training(self, source: Any) -> None:
        """A step opened on ``source``'s batch fetched again before any backward: evaluation."""
        self.training.discard(source)
        self.evaluation.add(source)

    def forward_between_steps(self) -> None:
        """A model's forward ran between steps: the held fetches fed it, their sources are evaluation
        (unless known as training) and their time stays between steps."""
        for source, held in self.held.items():
            if source not in self.training:
                self.evaluation.add(source)
            self.dropped_fetches += held.fetches
        self.held.clear()
        self.last = None

    def discard(self) -> None:
        """The held fetches fed evaluation (the caller knows: ``discard_input_wait``): dropped, counted."""
        for held in self.held.values():
            self.dropped_fetches += held.fetches
        self.held.clear()
        self.last = None

    def take(self, training_fetched: bool) -> tuple[int, int, int | None]:
        """A step begins: the held fetches of sources not known as evaluation fed it (they become
        training), and so did the last batch fetched when no training source's fetch followed it
        (``training_fetched``: the training loader changed); returns their (wait, fetches, samples of
        the last batch). The others are dropped (counted)."""
        wait = fetches = 0
        samples = None
        last = None if training_fetched else self.last
        for known in (self.training, self.evaluation):  # bounded: a new dataset each epoch adds one
            if len(known) > MAX_SOURCES:
                known.clear()  # (the same set objects: the recorder reads ``training`` inline)
        for source, held in self.held.items():
            if source in self.evaluation and source != last:
                self.dropped_fetches += held.fetches
                continue
            self.evaluation.discard(source)
            self.training.add(source)
            wait += held.wait_ns
            fetches += held.fetches
            if held.samples is not None and (samples is None or source == last):
                samples = held.samples
        self.held.clear()
        self.last = None
        return wait, fetches, samples
