"""Choose the analysed steps and their clock.

A window holds *aligned* steps: step numbers present on every observed rank (steps that
raised are left out). It is the whole run, its last N aligned steps, or a step range. One
clock serves the whole window: GPU only when every step in it carries GPU timings for its
traced time, its input wait and every phase that ran; otherwise CPU.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from traceml_otel.analyze.findings import WindowInfo
from traceml_otel.analyze.kinds import Clock
from traceml_otel.analyze.run_model import StepTiming, WindowSpec


@dataclass(frozen=True, slots=True)
class StepWindow:
    """Aligned steps per rank: ``per_rank[i]`` holds rank ``ranks[i]``'s steps in step order."""

    ranks: tuple[int, ...]
    step_numbers: tuple[int, ...]
    per_rank: tuple[tuple[StepTiming, ...], ...]

    @property
    def steps(self) -> int:
        """Aligned steps per rank."""
        return len(self.step_numbers)

    def all_steps(self) -> list[StepTiming]:
        """Every (rank, step) record of the window."""
        return [s for steps in self.per_rank for s in steps]


def group_by_rank(steps: Sequence[StepTiming]) -> dict[int, list[StepTiming]]:
    """Completed (non-failed) steps of each rank, in step order."""
    by_rank: dict[int, list[StepTiming]] = {}
    for step in steps:
        if step.error is None:
            by_rank.setdefault(step.rank, []).append(step)
    for rank_steps in by_rank.values():
        rank_steps.sort(key=lambda s: s.step)
    return dict(sorted(by_rank.items()))


def aligned_window(by_rank: dict[int, list[StepTiming]]) -> StepWindow:
    """Every step number that all ranks completed."""
    if not by_rank:
        return StepWindow((), (), ())
    common = set.intersection(*({s.step for s in rank_steps} for rank_steps in by_rank.values()))
    numbers = tuple(sorted(common))
    per_rank = tuple(tuple(s for s in rank_steps if s.step in common) for rank_steps in by_rank.values())
    return StepWindow(tuple(by_rank), numbers, per_rank)


def select_window(run: StepWindow, spec: WindowSpec) -> tuple[StepWindow, WindowInfo]:
    """Narrow the aligned run to ``spec`` and describe the result."""
    numbers = run.step_numbers
    requested = ""
    if spec.last is not None:
        numbers = numbers[-spec.last :]
        requested = f"last {spec.last} steps"
    elif spec.mode == "range":
        low = spec.first_step if spec.first_step is not None else -1
        high = spec.last_step if spec.last_step is not None else 1 << 62
        numbers = tuple(n for n in numbers if low <= n <= high)
        requested = f"steps {spec.first_step if spec.first_step is not None else ''}:" + (
            f"{spec.last_step}" if spec.last_step is not None else ""
        )
    if numbers != run.step_numbers:
        keep = set(numbers)
        window = StepWindow(
            run.ranks, numbers, tuple(tuple(s for s in steps if s.step in keep) for steps in run.per_rank)
        )
    else:
        window = run
    info = WindowInfo(
        mode=spec.mode,
        first_step=numbers[0] if numbers else None,
        last_step=numbers[-1] if numbers else None,
        steps=len(numbers),
        requested=requested,
    )
    return window, info


def select_clock(window: StepWindow) -> Clock:
    """GPU when every step of the window has complete GPU timings, else CPU."""
    steps = window.all_steps()
    if steps and all(s.has_gpu_timing() for s in steps):
        return Clock.GPU
    return Clock.CPU


def window_parallelism(window: StepWindow) -> str:
    """``fsdp`` if any step in the window is FSDP-wrapped, else the most common wrapping."""
    seen = [s.parallelism for s in window.all_steps()]
    if "fsdp" in seen:
        return "fsdp"
    return max(set(seen), key=seen.count) if seen else "none"


def without_steps(window: StepWindow, drop: Collection[int]) -> StepWindow:
    """``window`` less the aligned steps numbered in ``drop`` (on every rank)."""
    if not drop or not window.step_numbers:
        return window
    keep = [i for i, n in enumerate(window.step_numbers) if n not in drop]
    return StepWindow(window.ranks, tuple(window.step_numbers[i] for i in keep),
                      tuple(tuple(steps[i] for i in keep) for steps in window.per_rank))
