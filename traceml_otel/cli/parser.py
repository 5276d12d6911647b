"""The argument parser every ``traceml`` command uses: one error line, with the closest spelling.

argparse prints its whole usage block before an error and never suggests a spelling (Python 3.14's
``suggest_on_error`` is not in the versions we support). A user who typed one option wrong gets one
line instead: ``traceml analyze: error: unrecognized arguments: --fromat (did you mean --format?); see
traceml analyze --help``, exit 2.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from traceml_otel.sanitize import strip_control

_UNKNOWN = re.compile(r"unrecognized arguments: (.*)")
_CHOICE = re.compile(r"invalid choice: '([^']*)'")


def closest(word: str, candidates: Sequence[str]) -> str | None:
    """The candidate ``word`` was most likely meant to be (``None`` when none is close)."""
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line with a "did you mean" (subparsers inherit it)."""

    def option_names(self) -> list[str]:
        """Every long option this parser knows."""
        return [name for action in self._actions for name in action.option_strings if name.startswith("--")]

    def command_names(self) -> list[str]:
        """The subcommands this parser knows (empty when it has none)."""
        return [name for action in self._actions if isinstance(action, argparse._SubParsersAction)
                for name in action.choices]

    def hint(self, message: str) -> str:
        """`` (did you mean X?)`` for the first unknown option or command in argparse's ``message``."""
        unknown = _UNKNOWN.search(message)
        if unknown:
            first = unknown.group(1).split()[0].partition("=")[0]
            guess = closest(first, self.option_names()) if first.startswith("-") else None
            return f" (did you mean {guess}?)" if guess else ""
        choice = _CHOICE.search(message)
        if choice:
            names = self.command_names() or [c for a in self._actions for c in (a.choices or ())]
            guess = closest(choice.group(1), [str(name) for name in names])
            return f" (did you mean {guess}?)" if guess else ""
        return ""

    def error(self, message: str) -> NoReturn:
        """One line on stderr, ``traceml CMD: error: MESSAGE (did you mean X?); see traceml CMD --help``."""
        text = strip_control(" ".join(message.split()))
        print(f"{self.prog}: error: {text}{self.hint(message)}; see {self.prog} --help", file=sys.stderr)
        raise SystemExit(2)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """As argparse, except that an unknown option is reported by the subcommand it was given to,
        which knows the spellings to suggest."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.owner_of(parsed).error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def owner_of(self, parsed: argparse.Namespace) -> CommandParser:
        """The deepest subcommand parser that ``parsed`` went through (this one when none)."""
        parser: CommandParser = self
        while True:
            chosen = None
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    name = getattr(parsed, action.dest or "", None)
                    chosen = action.choices.get(name) if name else None
            if not isinstance(chosen, CommandParser):
                return parser
            parser = chosen
