"""OTLP protobuf for our spans, written straight from :class:`SpanData`, for the SDK's exporters to send.

The SDK's path (a ``ReadableSpan`` per span, then its trace encoder building protobuf messages
attribute by attribute) cost the emitter about 190 us of CPU per 4-span step, the largest stage
of its work (``benchmarks/emitter_cost.py``). Our spans have one fixed shape (kind INTERNAL, a local
parent or none, no events or links, attributes of str, bool, int, float or a list of them), so this
module writes each span's ``Span`` message bytes once, when the step is offered, and a batch's
``ExportTraceServiceRequest`` is the concatenation under the resource and scope (encoded once).
Field order, presence and values are the SDK encoder's: ``tests/emit/test_otlp_encode.py`` checks
the bytes are identical, and that they decode to the same spans.

The transport stays the SDK's: :mod:`traceml_otel.emit.span_export` hands an :class:`EncodedSpans`
batch to the SDK's OTLP exporters (endpoint, headers, TLS, compression, timeout and retries from
the ``OTEL_EXPORTER_OTLP_*`` environment, as before).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from traceml_otel.emit.spans import SpanData

_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")
_SPAN_KIND_INTERNAL = b"\x30\x01"  # Span.kind (6) = SPAN_KIND_INTERNAL
_EMPTY_STATUS = b"\x7a\x00"  # Span.status (15), code UNSET: present, empty (as the SDK writes it)
_FLAGS = b"\x85\x01" + struct.pack("<I", 0x100)  # Span.flags (16, fixed32): "is remote" known, false
_CACHE_LIMIT = 4096
TRACE_SLOT, ID_SLOT, TIME_SLOT, DOUBLE_SLOT, RAW_SLOT = "trace", "id", "time", "double", "raw"
"""The slots of :meth:`SpanEncoder.template` (any other slot is an int attribute's key)."""
_IDS_END = 28
"""Bytes of a span's message before its ``trace_state``: trace id and span id fields."""
_STATUS_TAIL = _EMPTY_STATUS + _FLAGS


def _varint(value: int) -> bytes:
    """A protobuf varint (negative int64 as ten bytes, two's complement)."""
    if 0 <= value < 0x80:
        return _SMALL[value]
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [bytes((n,)) for n in range(0x80)]
varint = _varint


def _field(tag: bytes, body: bytes) -> bytes:
    """A length-delimited field: its tag, the body's length, the body."""
    length = len(body)
    return tag + (_SMALL[length] if length < 0x80 else _varint(length)) + body


def _any_value(value: Any) -> bytes:
    """An ``AnyValue`` message body, as the SDK's ``_encode_value`` makes it."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode("utf-8"))
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(item)) for item in value))
    raise TypeError(f"attribute value of type {type(value).__name__} cannot be encoded")


class _AttributeEncoder:
    """``KeyValue`` fields (``Span.attributes``, tag 9) with the constant parts cached per key."""

    def __init__(self, tag: bytes) -> None:
        self._tag = tag
        self._double: dict[str, bytes] = {}
        self._int: dict[tuple[str, int], bytes] = {}
        self._pairs: dict[tuple[str, type, object], bytes] = {}

    def _double_prefix(self, key: str) -> bytes:
        # A double attribute is always tag + len + key field + value tag + 9 bytes: all but 8 are constant.
        prefix = self._double.get(key)
        if prefix is None:
            key_field = _field(b"\x0a", key.encode("utf-8"))
            body_length = len(key_field) + 11  # value field: tag, length 9, AnyValue tag, 8 bytes
            prefix = self._double[key] = self._tag + _varint(body_length) + key_field + b"\x12\x09\x21"
        return prefix

    def encode(self, key: str, value: Any) -> bytes:
        kind = type(value)
        if kind is float:
            return self._double_prefix(key) + _DOUBLE.pack(value)
        if kind is str or kind is bool or (kind is int and -1 <= value <= 1024):
            pair = (key, kind, value)
            encoded = self._pairs.get(pair)
            if encoded is None:
                encoded = self._key_value(key, value)
                if len(self._pairs) < _CACHE_LIMIT:
                    self._pairs[pair] = encoded
            return encoded
        return self._key_value(key, value)

    def _key_value(self, key: str, value: Any) -> bytes:
        return _field(self._tag, _field(b"\x0a", key.encode("utf-8")) + _field(b"\x12", _any_value(value)))

    def _int_prefix(self, key: str, varint_length: int) -> bytes:
        # An int attribute is tag + len + key field + value tag + len + AnyValue tag + the varint: all but
        # the varint is constant for a key and a varint length.
        prefix = self._int.get((key, varint_length))
        if prefix is None:
            key_field = _field(b"\x0a", key.encode("utf-8"))
            body_length = len(key_field) + 3 + varint_length  # value tag, its length, AnyValue tag
            value_head = b"\x12" + _SMALL[1 + varint_length] + b"\x18"
            prefix = self._tag + _varint(body_length) + key_field + value_head
            self._int[key, varint_length] = prefix
        return prefix

    def encode_all(self, attributes: Any) -> bytes:
        """Every attribute's ``KeyValue`` field, in order: :meth:`encode`'s bytes, with its common cases
        (floats, non-negative ints, cached strings and booleans) inline, as one loop costs half as much."""
        if not attributes:
            return b""
        parts: list[bytes] = []
        append = parts.append
        double, integer, pairs = self._double, self._int, self._pairs
        for key, value in attributes.items():
            kind = type(value)
            if kind is float:
                append((double.get(key) or self._double_prefix(key)) + _pack_double(value))
            elif kind is int and 0 <= value < _INT64_LIMIT:
                varint = _SMALL[value] if value < 0x80 else _varint(value)
                append((integer.get((key, len(varint))) or self._int_prefix(key, len(varint))) + varint)
            elif kind is str or kind is bool:
                encoded = pairs.get((key, kind, value))
                append(encoded if encoded is not None else self.encode(key, value))
            else:
                append(self.encode(key, value))
        return b"".join(parts)


_pack_double = _DOUBLE.pack
_INT64_LIMIT = 1 << 63


class SpanEncoder:
    """Encodes our spans as OTLP ``Span`` messages, and batches of them as one export request."""

    def __init__(self, resource: Resource, scope: InstrumentationScope) -> None:
        self._span_attributes = _AttributeEncoder(b"\x4a")  # Span.attributes (9)
        self._names: dict[str, bytes] = {}
        common = _AttributeEncoder(b"\x0a")  # Resource.attributes (1)
        resource_body = common.encode_all(resource.attributes)
        scope_body = _field(b"\x0a", scope.name.encode("utf-8"))
        if scope.version:
            scope_body += _field(b"\x12", scope.version.encode("utf-8"))
        scope_body += _AttributeEncoder(b"\x1a").encode_all(scope.attributes)  # scope attributes (3)
        self._resource_field = _field(b"\x0a", resource_body)  # ResourceSpans.resource (1)
        self._scope_field = _field(b"\x0a", scope_body)  # ScopeSpans.scope (1)
        self._resource_schema = _schema(getattr(resource, "schema_url", ""))
        self._scope_schema = _schema(getattr(scope, "schema_url", ""))

    def encode(self, span: SpanData, trace_state: bytes = b"", extra: bytes = b"") -> bytes:
        """One ``ScopeSpans.spans`` field (tag 2): the span's message, length-prefixed.

        ``trace_state`` (:meth:`trace_state_field`) and ``extra`` attribute fields after the span's own
        (:meth:`attribute_fields`) are the span budget's (:mod:`traceml_otel.emit.span_budget`): the
        bytes are the SDK's for that span with the tracestate on its context and those attributes
        appended."""
        name = self._names.get(span.name) or self._name(span.name)
        parent = b"" if span.parent_span_id is None else b"\x22\x08" + span.parent_span_id.to_bytes(8, "big")
        if span.error is None:
            status = _EMPTY_STATUS
        else:
            status = _field(b"\x7a", _field(b"\x12", span.error.encode("utf-8")) + b"\x18\x02")
        body = b"".join((
            b"\x0a\x10", span.trace_id.to_bytes(16, "big"), b"\x12\x08", span.span_id.to_bytes(8, "big"),
            trace_state, parent, name, _SPAN_KIND_INTERNAL,
            b"\x39", _FIXED64.pack(span.start_ns), b"\x41", _FIXED64.pack(span.end_ns),
            self._span_attributes.encode_all(span.attributes), extra, status, _FLAGS,
        ))
        return _field(b"\x12", body)

    def template(self, span: SpanData, variable: Sequence[str], raw: Sequence[str] = (),
                 ) -> list[bytes | str] | None:
        """:meth:`encode`'s bytes for ``span`` as constant pieces and slot kinds, in order: the trace id
        (:data:`TRACE_SLOT`), span id and parent id (:data:`ID_SLOT`), start and end (:data:`TIME_SLOT`),
        then each attribute named in ``variable``, in the span's order (:data:`DOUBLE_SLOT`, or the key
        itself for an int: its varint's length is in its ``KeyValue``'s lengths, :meth:`int_field`); an
        attribute named in ``raw`` is a slot as a whole (:data:`RAW_SLOT`: its :meth:`attribute_fields`).
        Pieces alternate, a constant first and last (possibly empty). ``None`` for a span with an error
        status or a variable attribute of another kind (:mod:`traceml_otel.emit.step_protobuf`)."""
        if span.error is not None:
            return None
        attributes = self._span_attributes
        parent: list[bytes | str] = [] if span.parent_span_id is None else [b"\x22\x08", ID_SLOT]
        pieces: list[bytes | str] = [
            b"\x0a\x10", TRACE_SLOT, b"\x12\x08", ID_SLOT, *parent,
            self._name(span.name) + _SPAN_KIND_INTERNAL + b"\x39", TIME_SLOT, b"\x41", TIME_SLOT]
        for key, value in span.attributes.items():
            if key in raw:
                pieces += [b"", RAW_SLOT]
            elif key not in variable:
                pieces.append(attributes.encode(key, value))
            elif type(value) is float:
                pieces += [attributes._double_prefix(key), DOUBLE_SLOT]
            elif type(value) is int:
                pieces += [b"", key]
            else:
                return None
        pieces.append(_EMPTY_STATUS + _FLAGS)
        merged: list[bytes | str] = [b""]
        for piece in pieces:  # adjacent constants joined: constant, slot, constant, ..., constant
            if type(piece) is bytes and type(merged[-1]) is bytes:
                merged[-1] += piece
            elif type(piece) is bytes or type(merged[-1]) is bytes:
                merged.append(piece)
            else:
                merged += [b"", piece]
        return merged

    def int_prefix(self, key: str, length: int) -> bytes:
        """An int attribute's ``KeyValue`` field before its value's varint (:func:`varint`) of ``length``
        bytes."""
        attributes = self._span_attributes
        return attributes._int.get((key, length)) or attributes._int_prefix(key, length)

    def _name(self, name: str) -> bytes:
        encoded = self._names.get(name)
        if encoded is None:
            encoded = _field(b"\x2a", name.encode("utf-8"))
            if len(self._names) < _CACHE_LIMIT:
                self._names[name] = encoded
        return encoded

    def with_trace_state(self, encoded: bytes, trace_state: bytes, extra: bytes = b"") -> bytes:
        """A span :meth:`encode` wrote without tracestate or extra attributes, and without an error
        status, as :meth:`encode` writes it with them (the span budget's, for spans encoded ahead)."""
        start = 2 if encoded[1] < 0x80 else 3 if encoded[2] < 0x80 else 4  # past the tag and length
        body = encoded[start:]
        if not body.endswith(_STATUS_TAIL) or len(encoded) > 1 << 21:
            raise ValueError("not a span encoded without an error status")
        tail = len(body) - len(_STATUS_TAIL)
        return _field(b"\x12", b"".join((body[:_IDS_END], trace_state, body[_IDS_END:tail], extra,
                                         body[tail:])))

    def trace_state_field(self, trace_state: str) -> bytes:
        """``Span.trace_state`` (3) of a W3C tracestate text, for :meth:`encode` (empty: none)."""
        return _field(b"\x1a", trace_state.encode("ascii")) if trace_state else b""

    def attribute_fields(self, attributes: dict[str, object]) -> bytes:
        """``Span.attributes`` fields of extra attributes, for :meth:`encode`."""
        return self._span_attributes.encode_all(attributes)

    def request(self, encoded_spans: Sequence[bytes]) -> bytes:
        """The ``ExportTraceServiceRequest`` of spans encoded by :meth:`encode` (one resource, one scope).

        One ``join`` of the pieces, the enclosing messages' lengths worked out first: nesting the
        messages by concatenation copied the whole request (about 0.7 MB at 2,048 spans) once per
        level, into fresh large allocations, about 1.1 ms a call against 0.04 ms."""
        scope_length = len(self._scope_field) + sum(map(len, encoded_spans)) + len(self._scope_schema)
        scope_head = b"\x12" + _varint(scope_length)
        resource_length = (len(self._resource_field) + len(scope_head) + scope_length
                           + len(self._resource_schema))
        return b"".join([b"\x0a", _varint(resource_length), self._resource_field, scope_head,
                         self._scope_field, *encoded_spans, self._scope_schema, self._resource_schema])


def _schema(url: str | None) -> bytes:
    return _field(b"\x1a", url.encode("utf-8")) if url else b""


class EncodedSpans(Sequence[bytes]):
    """A batch of encoded spans on its way to an SDK exporter; ``len()`` is its span count."""

    def __init__(self, encoder: SpanEncoder, spans: list[bytes]) -> None:
        self._encoder = encoder
        self._spans = spans

    def __len__(self) -> int:
        return len(self._spans)

    def __getitem__(self, index: Any) -> Any:
        return self._spans[index]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._spans)

    def request_bytes(self) -> bytes:
        """The serialised ``ExportTraceServiceRequest``."""
        return self._encoder.request(self._spans)

