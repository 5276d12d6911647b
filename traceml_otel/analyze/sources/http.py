"""A small JSON-over-HTTP GET (stdlib ``urllib``) with errors a user can act on."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

from traceml_otel.analyze.sources.base import SourceError


def get_documents(
    base_url: str,
    path: str,
    params: Mapping[str, object],
    *,
    what: str,
    timeout: float,
    missing_ok: bool = False,
) -> list[object]:
    """GET ``base_url + path`` and return the JSON documents of the body (one, or several in a row).

    Args:
        what: the backend's name for messages (``Tempo``, ``Jaeger``).
        missing_ok: answer ``[]`` to HTTP 404 (Jaeger's "no traces found").

    Raises:
        SourceError: the backend is unreachable, too slow, answers an error status or not JSON.
    """
    url = base_url.rstrip("/") + path + ("?" + urllib.parse.urlencode(params) if params else "")
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        if missing_ok and error.code == 404:
            return []
        detail = error.read()[:300].decode("utf-8", "replace").strip()
        raise SourceError(
            f"{what} at {base_url} answered HTTP {error.code} to {path}: {detail or error.reason}"
        ) from None
    except urllib.error.URLError as error:
        raise SourceError(f"cannot reach {what} at {base_url}: {error.reason}") from None
    except TimeoutError:
        raise SourceError(f"{what} at {base_url} did not answer within {timeout:g} s") from None
    except (OSError, ValueError) as error:
        raise SourceError(f"cannot query {what} at {base_url}: {error}") from None
    return _documents(body, what)


def _documents(body: bytes, what: str) -> list[object]:
    """One JSON value, or several back to back (a streamed gRPC-gateway answer)."""
    text = body.decode("utf-8", "replace").strip()
    decoder = json.JSONDecoder()
    documents: list[object] = []
    position = 0
    while position < len(text):
        try:
            document, position = decoder.raw_decode(text, position)
        except ValueError as error:
            raise SourceError(f"{what} answered something that is not JSON ({error})") from None
        documents.append(document)
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
    return documents
