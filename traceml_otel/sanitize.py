"""Hostile or secret strings made safe to print or store: control characters and secret values.

- :func:`strip_control` removes terminal control characters (ANSI escapes included) from text
  that came from span data, so a run id cannot repaint the user's terminal.
- :func:`redact_argv` hides the values of command-line options and ``NAME=value`` settings whose
  names look like secrets (token, key, secret, password, auth, credential), and passwords in URLs,
  before a command line goes into ``manifest.json`` and the reports.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

REDACTED = "[redacted]"
SECRET_NAME = re.compile(
    r"token|secret|passw|pwd|auth|credential|cookie|session|(?:^|[-_.]|api|private|access)keys?(?:$|[-_.])",
    re.IGNORECASE,
)
"""A name that looks like it holds a secret (over-matching is the safe side; ``keyword`` is not one)."""
_CONTROL = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])"  # CSI, OSC, 2-byte escapes
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # every other control character but tab and newline
)
_URL_PASSWORD = re.compile(r"(://[^/\s:@]+:)[^/\s@]+@")
_OPTION = re.compile(r"^(-{1,2}[A-Za-z0-9][\w.-]*)(=)(.*)$", re.DOTALL)
_SETTING = re.compile(r"^([A-Za-z_][\w.-]*)(=)(.*)$", re.DOTALL)


_ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_line(value: object) -> str:
    """``value`` (a path, a name) as one printable line: every control character, newline and tab
    included, written as its escape (``run\\nx``), so a folder name cannot split or repaint a line."""
    return _ANY_CONTROL.sub(lambda found: repr(found.group())[1:-1], str(value))


def strip_control(text: str) -> str:
    """``text`` without control characters and escape sequences; newlines and tabs stay."""
    return _CONTROL.sub("", text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with secret-looking values replaced by ``[redacted]``.

    ``--api-token X`` and ``--api-token=X`` hide ``X``; ``HF_TOKEN=X`` hides ``X``;
    ``https://user:pw@host`` hides ``pw``. Option names and everything else stay.
    """
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        match = _OPTION.match(arg) or _SETTING.match(arg)
        if match and _secret_name(match[1]):
            out.append(f"{match[1]}={REDACTED}")
            continue
        if arg.startswith("-") and "=" not in arg and _secret_name(arg):
            hide_next = True
        out.append(_URL_PASSWORD.sub(rf"\g<1>{REDACTED}@", arg))
    return out


def _secret_name(name: str) -> bool:
    return SECRET_NAME.search(name.lstrip("-")) is not None
