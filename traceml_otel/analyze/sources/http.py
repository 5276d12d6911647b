"""A small JSON-over-HTTP GET (stdlib ``urllib``) with errors a user can act on, and bounds.

Every read is bounded three ways: ``timeout`` for each socket operation, a total deadline for
all the requests of one analysis (``ReadLimits.total_s``), and a maximum answer size
(``ReadLimits.max_bytes``). A backend that trickles its answer or streams without end is cut
off with a :class:`SourceError` that names the bound and the option that sets it.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

from traceml_otel.analyze.sources.base import ReadLog, SourceError, SpanSource
from traceml_otel.analyze.timerange import TimeRange
from traceml_otel.sanitize import REDACTED, strip_control

DEFAULT_TOTAL_S = 600.0
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
_CHUNK = 1 << 16


@dataclass(slots=True)
class ReadLimits:
    """Bounds of a backend read: per socket operation, in all, and per answer.

    ``total_s`` starts counting at the first request (``--read-deadline``); ``max_bytes`` caps each
    answer's body (``--max-response-mb``).
    """

    timeout: float = 30.0
    total_s: float = DEFAULT_TOTAL_S
    max_bytes: int = DEFAULT_MAX_BYTES
    _deadline: float | None = field(default=None, repr=False)

    def remaining(self) -> float:
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self.total_s
        return self._deadline - now


class _Cancelled(Exception):
    pass


_CREDENTIALS: dict[str, tuple[str, str]] = {}
"""By the shown URL (:func:`shown_url`): the URL to request (no user-info) and its ``Authorization``."""


def shown_url(url: str) -> str:
    """``url`` fit to print: with user-info (``http://alice:S3CRET@host``) its password is replaced by
    ``[redacted]`` (a user name alone, often a token, is replaced itself), and the credentials are kept
    here for :func:`get_documents` to send as HTTP basic authentication, as curl and the OTel exporters
    do. Every message and report names the backend by this form; the password is never printed."""
    try:
        parts = urllib.parse.urlsplit(url)
        user, password, host = parts.username, parts.password, parts.netloc.rpartition("@")[2]
    except ValueError:  # not a URL we can split: print it without anything that looks like user-info
        return _printable(re.sub(r"//[^/@]*@", f"//{REDACTED}@", url))
    if "@" not in parts.netloc:
        return url
    name = urllib.parse.quote(urllib.parse.unquote(user or ""), safe="")
    who = f"{name}:{REDACTED}" if password is not None else REDACTED
    shown = urllib.parse.urlunsplit(parts._replace(netloc=f"{who}@{host}"))
    pair = f"{urllib.parse.unquote(user or '')}:{urllib.parse.unquote(password or '')}"
    request_base = urllib.parse.urlunsplit(parts._replace(netloc=host))
    _CREDENTIALS[shown] = (request_base, "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii"))
    return shown


class HttpSpanSource(SpanSource):
    """A span source behind an HTTP search API (Tempo, Jaeger): its address, search range, page size
    and read bounds, and the requests, counted in pages, that every search of it makes."""

    backend = "HTTP"
    """The backend's name in messages (``Tempo``, ``Jaeger``)."""

    def __init__(
        self,
        url: str,
        *,
        when: TimeRange,
        run_id: str | None = None,
        service: str | None = None,
        page_size: int = 500,
        timeout: float = 30.0,
        log: ReadLog | None = None,
        limits: ReadLimits | None = None,
    ) -> None:
        super().__init__(run_id=run_id, service=service, log=log)
        self.url = shown_url(url)
        self.when = when
        self.page_size = page_size
        self.timeout = timeout
        self.limits = limits if limits is not None else ReadLimits(timeout=timeout)
        self.pages = 0

    def describe(self) -> str:
        return f"{self.backend} {self.url}"

    def get_page(self, path: str, params: Mapping[str, object], *, missing_ok: bool = False) -> list[object]:
        """One page of the search (:func:`get_documents`, within this source's bounds)."""
        self.pages += 1
        return get_documents(self.url, path, params, what=self.backend, timeout=self.timeout,
                             missing_ok=missing_ok, limits=self.limits)

    def skipped(self, exc: BaseException, what: str = "a malformed span") -> None:
        """Say that part of the current page could not be read (the rest is)."""
        self.log.warn(f"{self.backend} {self.url} page {self.pages}: skipped {what} "
                      f"({type(exc).__name__}: {str(exc)[:80]})")


def get_documents(
    base_url: str,
    path: str,
    params: Mapping[str, object],
    *,
    what: str,
    timeout: float,
    missing_ok: bool = False,
    limits: ReadLimits | None = None,
) -> list[object]:
    """GET ``base_url + path`` and return the JSON documents of the body (one, or several in a row).

    Args:
        what: the backend's name for messages (``Tempo``, ``Jaeger``).
        missing_ok: answer ``[]`` to HTTP 404 (Jaeger's "no traces found").
        limits: the total deadline and size cap (default: one fresh :class:`ReadLimits`).

    Raises:
        SourceError: the backend is unreachable, too slow, answers an error status, not JSON,
            or more than the limits allow.
    """
    limits = limits if limits is not None else ReadLimits(timeout=timeout)
    remaining = limits.remaining()
    if remaining <= 0:
        raise _deadline_error(what, base_url, limits)
    # user-info goes as a header, never in the request line
    request_base, authorization = _CREDENTIALS.get(base_url, (base_url, None))
    url = request_base.rstrip("/") + path + ("?" + urllib.parse.urlencode(params) if params else "")
    outcome: dict[str, object] = {}
    cancelled = threading.Event()

    def fetch() -> None:
        try:
            outcome["body"] = _fetch(url, base_url, path, what, min(timeout, remaining), missing_ok, limits,
                                     cancelled, authorization)
        except BaseException as error:  # handed to the caller's thread
            outcome["error"] = error

    # The request runs on a helper thread so that the deadline also covers a server that trickles
    # its headers or body one byte at a time (each socket read then returns before ``timeout``).
    reader = threading.Thread(target=fetch, name="traceml-http", daemon=True)
    reader.start()
    reader.join(remaining)
    if reader.is_alive():
        cancelled.set()  # the thread stops at its next read; its socket times out at the latest
        raise _deadline_error(what, base_url, limits)
    error = outcome.get("error")
    if isinstance(error, _Cancelled):
        raise _deadline_error(what, base_url, limits)
    if isinstance(error, BaseException):
        raise error
    assert isinstance(outcome.get("body"), bytes | bytearray)
    return _documents(outcome.pop("body"), what)  # type: ignore[arg-type]  # no other reference kept


def _fetch(
    url: str, base_url: str, path: str, what: str, timeout: float, missing_ok: bool, limits: ReadLimits,
    cancelled: threading.Event, authorization: str | None = None,
) -> bytes | bytearray:
    headers = {"Accept": "application/json", **({"Authorization": authorization} if authorization else {})}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            declared = response.headers.get("Content-Length")
            if declared and declared.isdigit() and int(declared) > limits.max_bytes:
                raise _size_error(what, base_url, limits)
            body = bytearray()  # grown in place: one copy of the answer, not a list and its join
            while True:
                if cancelled.is_set():
                    raise _Cancelled
                chunk = response.read1(_CHUNK)
                if not chunk:
                    if declared and declared.isdigit() and len(body) < int(declared):
                        raise SourceError(f"{what} at {base_url} cut its answer short ({len(body)} of "
                                          f"{declared} bytes); try again")
                    return body
                if len(body) + len(chunk) > limits.max_bytes:
                    raise _size_error(what, base_url, limits)
                body += chunk
    except urllib.error.HTTPError as error:
        if missing_ok and error.code == 404:
            return b"[]"
        try:
            detail = error.read(300)[:300].decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            detail = ""
        if error.code == 401:
            detail = ("the credentials in the URL were refused" if authorization else
                      "it needs credentials: give them in the URL (http://user:password@host)")
        raise SourceError(
            f"{what} at {base_url} answered HTTP {error.code} to {path}: {_printable(detail or error.reason)}"
        ) from None
    except urllib.error.URLError as error:
        raise SourceError(f"cannot reach {what} at {base_url}: {_printable(error.reason)}") from None
    except http.client.HTTPException as error:  # not HTTP, a bad status line, a body cut short
        raise SourceError(f"{what} at {base_url} did not answer in HTTP ({type(error).__name__}: "
                          f"{_printable(error)})") from None
    except TimeoutError:
        raise SourceError(f"{what} at {base_url} did not answer within {timeout:g} s (--timeout)") from None
    except (OSError, ValueError) as error:
        raise SourceError(f"cannot query {what} at {base_url}: {_printable(error)}") from None


def _printable(value: object, limit: int = 200) -> str:
    """What a server sent, as one short line without control characters."""
    text = " ".join(strip_control(str(value)).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _deadline_error(what: str, base_url: str, limits: ReadLimits) -> SourceError:
    return SourceError(f"reading from {what} at {base_url} took longer than the total deadline of "
                       f"{limits.total_s:g} s (--read-deadline); a slow or trickling answer was cut off")


def _size_error(what: str, base_url: str, limits: ReadLimits) -> SourceError:
    return SourceError(f"{what} at {base_url} answered more than {limits.max_bytes / 2**20:g} MiB "
                       "(--max-response-mb); ask for less with --page-size or --since/--until, or raise the "
                       "limit")


MAX_ANSWER_ITEMS = 4_000_000
"""JSON values (objects, arrays, and array or object members) one answer may decode into. A decoded
value takes 50 to 100 bytes, so this bounds an answer's decoded memory near 400 MB whatever its byte
size (a page of 500 steps of 8 ranks is about 1.5 million). With the body (at most ``--max-response-mb``)
and its text, one answer needs at most about 2 x max bytes + 400 MB; an answer refused by its count,
about 1 x max bytes."""


def answer_items(body: bytes | bytearray) -> int:
    """An upper estimate of the JSON values ``body`` decodes into (counted without decoding it)."""
    return body.count(b"{") + body.count(b"[") + body.count(b",")


def _documents(body: bytes | bytearray, what: str) -> list[object]:
    """One JSON value, or several back to back (a streamed gRPC-gateway answer).

    Raises:
        SourceError: the answer would decode into more than :data:`MAX_ANSWER_ITEMS` values, or is
            not JSON.
    """
    items = answer_items(body)
    if items > MAX_ANSWER_ITEMS:
        raise SourceError(f"{what} answered about {items:,} JSON items, more than the {MAX_ANSWER_ITEMS:,} "
                          "decoded at once (memory); ask for less with --page-size or --since/--until")
    text = body.decode("utf-8", "replace").strip()
    del body  # the last reference: from here on, the text and the decoded values only
    decoder = json.JSONDecoder()
    documents: list[object] = []
    position = 0
    while position < len(text):
        try:
            document, position = decoder.raw_decode(text, position)
        except (ValueError, RecursionError) as error:
            reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
            raise SourceError(f"{what} answered something that is not usable JSON ({reason})") from None
        documents.append(document)
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
    return documents
