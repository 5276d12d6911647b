"""Reading a typed record's fields out of a decoded wire message, each one checked.

The hello (:mod:`traceml_otel.wire.hello`) and the control messages (:mod:`traceml_otel.wire.control`)
are dataclasses sent as JSON objects; both sides read them back through :func:`decode_fields`, so a
missing field or a value of the wrong type is refused with one message, never misread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any

from traceml_otel.wire.frames import WireError


def decode_fields(
    kind: type, message: Mapping[str, Any], types: Mapping[str, tuple[type, ...]], label: str,
) -> dict[str, Any]:
    """The values in ``message`` of the dataclass ``kind``'s fields, for ``kind(**values)``.

    A field may be absent when it has a default (the record's default applies); ``None`` is accepted
    where the default is ``None``; any other value must be an instance of ``types[name]`` (a ``bool``
    only where ``bool`` itself is listed, though it is an ``int``). Keys ``kind`` does not know are
    ignored. Raises :class:`~traceml_otel.wire.frames.WireError` naming ``label`` and the field.
    """
    values: dict[str, Any] = {}
    for spec in fields(kind):
        if spec.name not in message:
            if spec.default is MISSING and spec.default_factory is MISSING:
                raise WireError(f"the {label} lacks {spec.name!r}")
            continue
        value = message[spec.name]
        if value is None and spec.default is None:
            values[spec.name] = None
            continue
        allowed = types[spec.name]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            expected = " or ".join(kind_.__name__ for kind_ in allowed)
            raise WireError(f"the {label}'s {spec.name!r} is {type(value).__name__}, not {expected}")
        values[spec.name] = value
    return values
