"""The local copy: one rank's spans as OTLP JSON Lines, as the collector's file exporter writes.

Encoded by hand, on purpose. The SDK's OTLP protobuf encoder plus protobuf's JSON mapping
costs about 150 us per span here (590 us for a 4-span step), enough to steal a visible
share of a 2-core machine from training at 1 ms steps; the official ``otlp-json-file``
exporter is beta and pins other versions of the OTLP packages than the stable exporters.
Our spans have one fixed shape, so the encoder below writes the OTLP JSON mapping for it
(hex ids, integer enums, 64-bit integers as strings) straight into strings, about 10 us
per span, and a test checks it field for field against the SDK encoder's output.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from traceml_otel.emit.spans import SpanData
from traceml_otel.wire._json import ensure_run_dir

_SPAN_FLAGS_HAS_IS_REMOTE = 0x100  # a local parent (or none): "is remote" known and false
_SPAN_KIND_INTERNAL = 1
_dumps = json.dumps
_string_json: dict[str, str] = {}  # attribute strings repeat (run id, host, phase names)
_STRING_CACHE_LIMIT = 4096


def _str_json(value: str) -> str:
    encoded = _string_json.get(value)
    if encoded is None:
        encoded = _dumps(value)
        if len(_string_json) < _STRING_CACHE_LIMIT:
            _string_json[value] = encoded
    return encoded


def _value_json(value: object) -> str:
    kind = type(value)
    if kind is str:
        return '{"stringValue":' + _str_json(value) + "}"
    if kind is bool:
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if kind is int:
        return '{"intValue":"' + str(value) + '"}'
    if kind is float:
        # repr() is the shortest round-trip form, as json.dumps writes finite floats.
        text = repr(value) if math.isfinite(value) else _dumps(value)
        return '{"doubleValue":' + text + "}"
    if kind is list or kind is tuple:
        return '{"arrayValue":{"values":[' + ",".join(_value_json(item) for item in value) + "]}}"
    return '{"stringValue":' + _dumps(str(value)) + "}"


_number_prefix: dict[tuple[str, type], str] = {}
"""``{"key":K,"value":{"intValue":"`` (or ``doubleValue``) per key: numbers rarely repeat, keys do."""
_pair_json: dict[tuple[str, type, object], str] = {}
"""Whole encoded attributes whose values repeat (strings, booleans: run id, host, phase names)."""


def _attribute_json(key: str, value: object) -> str:
    """One ``KeyValue``; the cached fast paths give what :func:`_value_json` gives."""
    kind = type(value)
    if kind is float:
        prefix = _number_prefix.get((key, float))
        if prefix is None:
            prefix = _number_prefix[key, float] = '{"key":' + _dumps(key) + ',"value":{"doubleValue":'
        return prefix + (repr(value) if math.isfinite(value) else _dumps(value)) + "}}"
    if kind is int:
        prefix = _number_prefix.get((key, int))
        if prefix is None:
            prefix = _number_prefix[key, int] = '{"key":' + _dumps(key) + ',"value":{"intValue":"'
        return prefix + str(value) + '"}}'
    if kind is str or kind is bool:
        pair = (key, kind, value)
        encoded = _pair_json.get(pair)
        if encoded is None:
            encoded = '{"key":' + _dumps(key) + ',"value":' + _value_json(value) + "}"
            if len(_pair_json) < _STRING_CACHE_LIMIT:
                _pair_json[pair] = encoded
        return encoded
    return '{"key":' + _dumps(key) + ',"value":' + _value_json(value) + "}"


_SHAPE_LIMIT = 512
_shapes: dict[tuple[tuple[str, ...], tuple[type, ...]], _Shape] = {}
"""Attribute sets by their keys and value types: a span kind repeats one shape on every step."""


class _Shape:
    """The JSON of one attribute shape as a ``%`` template: the keys and punctuation are encoded once;
    ints (``%d``) and floats (``%r``, the shortest round trip, as ``json.dumps`` writes them) are
    formatted in C; only the string and boolean slots are looked up in Python."""

    __slots__ = ("float_slots", "template", "text_slots")

    def __init__(self, keys: tuple[str, ...], kinds: tuple[type, ...]) -> None:
        parts = []
        for key, kind in zip(keys, kinds, strict=True):
            prefix = ('{"key":' + _dumps(key) + ',"value":').replace("%", "%%")
            if kind is float:
                parts.append(prefix + '{"doubleValue":%r}}')
            elif kind is int:
                parts.append(prefix + '{"intValue":"%d"}}')
            elif kind is str:
                parts.append(prefix + '{"stringValue":%s}}')
            else:  # bool
                parts.append(prefix + '{"boolValue":%s}}')
        self.template = "[" + ",".join(parts) + "]"
        self.text_slots = tuple(i for i, kind in enumerate(kinds) if kind is str or kind is bool)
        self.float_slots = tuple(i for i, kind in enumerate(kinds) if kind is float)

    def fill(self, values: list[Any]) -> bool:
        """Make ``values`` (in the shape's order) the template's arguments, in place: strings and
        booleans JSON-encoded. False when a float is NaN or infinite: those are not JSON numbers, and
        the caller's slow path spells them."""
        for i in self.float_slots:
            if not _isfinite(values[i]):
                return False
        for i in self.text_slots:
            value = values[i]
            values[i] = _str_json(value) if type(value) is str else ("true" if value else "false")
        return True


_TEMPLATE_KINDS = frozenset((str, bool, int, float))


def _attributes_json(attributes: Any) -> str:
    if not attributes:
        return "[]"
    values = list(attributes.values())
    key = (tuple(attributes), tuple(map(type, values)))
    shape = _shapes.get(key)
    if shape is None:
        if not _TEMPLATE_KINDS.issuperset(key[1]) or len(_shapes) >= _SHAPE_LIMIT:
            return _attributes_json_slowly(attributes)
        shape = _shapes[key] = _Shape(*key)
    if not shape.fill(values):
        return _attributes_json_slowly(attributes)
    return shape.template % tuple(values)


_isfinite = math.isfinite


def _attributes_json_slowly(attributes: Any) -> str:
    return "[" + ",".join([_attribute_json(key, value) for key, value in attributes.items()]) + "]"


def _span_json(span: SpanData) -> str:
    """One span's JSON: by its whole-span template when it has one (every span of a kind repeats one
    shape on every step), else field by field."""
    if span.error is not None:  # an error status: rare, spelled field by field
        return _span_json_slowly(span)
    attributes = span.attributes
    values = list(attributes.values())
    parent = span.parent_span_id
    key = (span.name, parent is None, tuple(attributes), tuple(map(type, values)))
    shape = _span_shapes.get(key)
    if shape is None:
        if len(_span_shapes) >= _SHAPE_LIMIT or not _TEMPLATE_KINDS.issuperset(key[3]):
            return _span_json_slowly(span)
        shape = _span_shapes[key] = _SpanShape(span.name, parent is not None, key[2], key[3])
    if not shape.attributes.fill(values):
        return _span_json_slowly(span)
    if parent is None:
        return shape.template % (span.trace_id, span.span_id, span.start_ns, span.end_ns, *values)
    return shape.template % (span.trace_id, span.span_id, parent, span.start_ns, span.end_ns, *values)


class _SpanShape:
    """A whole span's JSON as one ``%`` template: ids (``%032x``, ``%016x``), times (``%d``), the name
    and every attribute key encoded once; only the attribute values are filled in per span."""

    __slots__ = ("attributes", "template")

    def __init__(self, name: str, has_parent: bool, keys: tuple[str, ...], kinds: tuple[type, ...]) -> None:
        attributes = self.attributes = _Shape(keys, kinds)
        self.template = _span_template_text(name, "%032x", "%016x", "%016x" if has_parent else None,
                                            attributes.template)


def _span_template_text(name: str, trace_spec: str, span_spec: str, parent_spec: str | None,
                        attributes: str) -> str:
    """A span's JSON as a ``%`` template around its attribute list (itself a template): the ids by
    the given conversion specs, start and end as ``%d``, the name encoded once, status unset."""
    parent = f',"parentSpanId":"{parent_spec}"' if parent_spec is not None else ""
    return (
        f'{{"traceId":"{trace_spec}","spanId":"{span_spec}"{parent},"name":' + _dumps(name).replace("%", "%%")
        + f',"kind":{_SPAN_KIND_INTERNAL},"startTimeUnixNano":"%d","endTimeUnixNano":"%d",'
        + '"attributes":' + attributes + ',"status":{},"flags":' + str(_SPAN_FLAGS_HAS_IS_REMOTE) + "}"
    )


def span_template(span: SpanData, variable: frozenset[str], raw: frozenset[str] = frozenset(),
                  ) -> tuple[str, list[str]] | None:
    """``span``'s JSON as a ``%`` template in which only its ids, times and the attributes named in
    ``variable`` are slots; every other attribute is written in as it is now (a value that repeats).

    The slots, in order: trace id, span id and parent id (when it has one) as hex text (``%s``), start
    and end (``%d``), then the variable attributes, an int as ``%d`` and a float as its ``repr`` text
    (``%s``: the shortest round trip, as ``json.dumps`` writes it). Returns the template and the
    variable attributes' keys in slot order (an attribute named in ``raw`` is a slot as a whole: its
    :func:`attribute_json` text), or ``None`` for a span this cannot template (an error
    status, a value of another kind, a non-finite float). Used by :mod:`traceml_otel.emit.step_lines`,
    which checks the filled template against :func:`span_json`.
    """
    if span.error is not None:
        return None
    parts, slots = [], []
    for key, value in span.attributes.items():
        kind = type(value)
        if key in raw:  # the whole attribute is a slot (%s: its attribute_json text)
            parts.append("%s")
            slots.append(key)
            continue
        if key not in variable:
            parts.append(_attribute_json(key, value).replace("%", "%%"))
            continue
        if kind is float and _isfinite(value):
            spec = '{"doubleValue":%s}}'
        elif kind is int:
            spec = '{"intValue":"%d"}}'
        else:
            return None
        parts.append(('{"key":' + _dumps(key) + ',"value":').replace("%", "%%") + spec)
        slots.append(key)
    parent_spec = "%s" if span.parent_span_id is not None else None
    return _span_template_text(span.name, "%s", "%s", parent_spec, "[" + ",".join(parts) + "]"), slots


attribute_json = _attribute_json
"""One attribute's ``KeyValue`` JSON, as :func:`span_json` writes it in a span's attributes."""


def span_json(span: SpanData) -> str:
    """One span's OTLP JSON, as the local copy writes it."""
    return _span_json(span)


_span_shapes: dict[tuple[str, bool, tuple[str, ...], tuple[type, ...]], _SpanShape] = {}
"""Whole-span templates by (name, root or not, attribute keys, value types); bounded by _SHAPE_LIMIT."""


def _span_json_slowly(span: SpanData) -> str:
    parent = "" if span.parent_span_id is None else f',"parentSpanId":"{span.parent_span_id:016x}"'
    status = "{}" if span.error is None else '{"message":' + _str_json(span.error) + ',"code":2}'
    return (
        f'{{"traceId":"{span.trace_id:032x}","spanId":"{span.span_id:016x}"{parent},'
        f'"name":{_str_json(span.name)},"kind":{_SPAN_KIND_INTERNAL},'
        f'"startTimeUnixNano":"{span.start_ns}","endTimeUnixNano":"{span.end_ns}",'
        f'"attributes":{_attributes_json(span.attributes)},"status":{status},"flags":{_SPAN_FLAGS_HAS_IS_REMOTE}}}'
    )


def traces_data_prefix(resource: Resource, scope: InstrumentationScope) -> str:
    """The JSON before the span list of a ``TracesData`` line: resource and scope, encoded once."""
    version = f',"version":{_dumps(scope.version)}' if scope.version else ""
    return (
        '{"resourceSpans":[{"resource":{"attributes":' + _attributes_json(resource.attributes)
        + '},"scopeSpans":[{"scope":{"name":' + _dumps(scope.name) + version + '},"spans":['
    )


def traces_data_json(spans: Sequence[SpanData], resource: Resource, scope: InstrumentationScope) -> str:
    """One OTLP ``TracesData`` JSON line (no newline) for spans of one resource and scope."""
    return traces_data_prefix(resource, scope) + ",".join(_span_json(span) for span in spans) + "]}]}]}"


_LINE_END = "]}]}]}\n"
_LINE_END_BYTES = _LINE_END.encode()
_GATHER_LIMIT = 500
"""Chunks whose pieces go to one ``writev`` (two pieces a chunk; Linux takes 1,024)."""


class LocalCopyWriter:
    """Appends each batch as one ``TracesData`` line to ``path`` and hands it to the OS at once.

    Handing each batch over means a crash of the emitter itself loses at most the batch in hand.
    The file is opened with ``O_NOFOLLOW``: a symbolic link planted at ``path`` is refused, not
    followed. A failed write raises ``OSError``; the emitter then turns the local copy off.
    """

    def __init__(self, path: Path, resource: Resource, scope: InstrumentationScope) -> None:
        ensure_run_dir(path.parent)
        self.path = path
        self._prefix = traces_data_prefix(resource, scope)
        self._prefix_bytes = self._prefix.encode()
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        self._fd: int | None = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._complete_bytes = os.lseek(self._fd, 0, os.SEEK_END)
        self.spans_written = 0
        self.steps_written = 0

    def write(self, spans: Sequence[SpanData], steps: int = 0) -> None:
        """Append one line holding ``spans`` (``steps`` step spans among them, for the count)."""
        if not spans or self._fd is None:
            return
        self._append((self._prefix + ",".join(_span_json(span) for span in spans) + _LINE_END).encode())
        self.spans_written += len(spans)
        self.steps_written += steps

    def write_encoded(self, chunks: list[str], spans: int, steps: int) -> None:
        """Append one line holding already encoded spans (:mod:`traceml_otel.emit.step_lines`): chunks
        of one or more steps' spans' JSON, comma-joined; ``spans`` spans of ``steps`` steps in all."""
        if not chunks or self._fd is None:
            return
        if len(chunks) > _GATHER_LIMIT:
            self._append((self._prefix + ",".join(chunks) + _LINE_END).encode())
        else:  # one gathered write of the pieces: no 100 KiB+ string built, copied and encoded per batch
            parts = [self._prefix_bytes]
            for text in chunks:
                parts += (text.encode(), b",")
            parts[-1] = _LINE_END_BYTES
            self._append(parts)
        self.spans_written += spans
        self.steps_written += steps

    def _append(self, encoded: bytes | list[bytes]) -> None:
        """Write one whole line (bytes, or its pieces in order); a failure cuts the file back to its
        last whole line."""
        assert self._fd is not None
        try:
            if isinstance(encoded, list):
                written = os.writev(self._fd, encoded)
                if written < sum(map(len, encoded)):  # a regular file takes it all but on a full disk
                    encoded = b"".join(encoded)[written:]
                else:
                    encoded = b""
            data = memoryview(encoded)
            while data:
                written = os.write(self._fd, data)
                data = data[written:]
        except OSError:
            try:  # no half line left behind (a full disk): cut back to the last whole one
                os.ftruncate(self._fd, self._complete_bytes)
            except OSError:
                pass
            raise
        self._complete_bytes = os.lseek(self._fd, 0, os.SEEK_END)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
