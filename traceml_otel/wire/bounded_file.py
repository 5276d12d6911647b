"""Reading files we did not write ourselves without blocking, or running out of memory, on them.

One place for every reader of a run folder or a span file (the analyzer's local copy and OTLP files,
``manifest.json``, ``rank-R.export.json``, ``rank-R.handoff.json``, and any new record such as a hang
record):

- :func:`open_regular` opens only a regular file: a FIFO, a socket, a device (``/dev/zero``,
  ``/dev/full``, or a link to one) or a directory is refused with :class:`RefusedFile`, whose message
  is one line naming the path and what it is. The type is checked before opening, the open is
  non-blocking (a FIFO swapped in between cannot hang it) and the type is checked again on the open
  descriptor.
- :func:`bounded_lines` yields a file's lines with a cap on each line's length: an over-long line is
  skipped without being held in memory; runs of NUL bytes (a crash-time tail, or the holes of a
  sparse file, which are skipped with ``SEEK_DATA`` without reading them) are reported, never parsed.
- :func:`read_bounded` reads a whole small file, refusing one larger than its cap.

Standard library only, like the rest of :mod:`traceml_otel.wire`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from traceml_otel.errors import TracemlError

MAX_LINE_BYTES = 64 << 20
"""Longest line :func:`bounded_lines` hands out (a local-copy line holds one batch: a few hundred KiB)."""
_CHUNK = 1 << 20
_NUL_LIKE = b"\0 \t\r\n"


class RefusedFile(TracemlError, OSError):
    """A path that is not a readable regular file (the message is one line saying why)."""


def file_kind(mode: int) -> str | None:
    """``None`` for a regular file, else what it is, in words (``a FIFO``, ``a character device``...)."""
    if stat.S_ISREG(mode):
        return None
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: Path, *, follow_links: bool = True) -> int:
    """A read-only descriptor on ``path`` if it is a regular file; never blocks.

    ``follow_links=False`` refuses a symbolic link (for records we wrote ourselves).

    Raises:
        RefusedFile: missing, unreadable, a link (when not followed), or not a regular file.
    """
    try:
        info = os.stat(path) if follow_links else os.lstat(path)
    except OSError as error:
        raise RefusedFile(f"{path}: cannot read it ({error.strerror or error})") from None
    if not follow_links and stat.S_ISLNK(info.st_mode):
        raise RefusedFile(f"{path}: is a symbolic link; not followed")
    _refuse_kind(path, info.st_mode)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        raise RefusedFile(f"{path}: cannot read it ({error.strerror or error})") from None
    try:
        _refuse_kind(path, os.fstat(fd).st_mode)  # swapped for a FIFO or device after the check
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refuse_kind(path: Path, mode: int) -> None:
    kind = file_kind(mode)
    if kind is not None:
        raise RefusedFile(f"{path}: is {kind}, not a regular file; not read")


def read_bounded(path: Path, max_bytes: int, *, follow_links: bool = True) -> bytes:
    """The whole of a regular file of at most ``max_bytes``.

    Raises:
        RefusedFile: as :func:`open_regular`, or the file is larger than ``max_bytes``.
    """
    fd = open_regular(path, follow_links=follow_links)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise RefusedFile(f"{path}: {size:,} bytes, larger than the {max_bytes:,} read whole; not read")
        parts, total = [], 0
        while total <= max_bytes:
            part = os.read(fd, min(_CHUNK, max_bytes + 1 - total))
            if not part:
                break
            parts.append(part)
            total += len(part)
    except OSError as error:
        if isinstance(error, RefusedFile):
            raise
        raise RefusedFile(f"{path}: cannot read it ({error.strerror or error})") from None
    finally:
        os.close(fd)
    if total > max_bytes:
        raise RefusedFile(f"{path}: larger than {max_bytes:,} bytes; not read")
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class Line:
    """One line of :func:`bounded_lines`: ``data`` (without its newline), or ``skipped`` saying why not."""

    number: int
    data: bytes | None
    skipped: str | None = None
    offset: int = 0
    """Byte offset where the line (or the skipped run) ends (for progress)."""


def _next_data(fd: int, position: int) -> int | None:
    """Where data starts at or after ``position`` (a sparse file's hole is skipped); None: no more data."""
    try:
        return os.lseek(fd, position, getattr(os, "SEEK_DATA", 3))
    except OSError as error:
        if error.errno == errno.ENXIO:
            return None  # only a hole up to the end
        return position  # no SEEK_DATA here: read everything
    except AttributeError:
        return position


class _LineState:
    """A line being assembled from chunks, held only up to ``max_line`` bytes."""

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self.parts: list[bytes] = []
        self.size = 0
        self.dropped = 0  # bytes of this line not kept (it is too long)
        self.nul_only = True
        self.has_nul = False

    def add(self, piece: bytes) -> None:
        if self.nul_only:
            if piece.strip(_NUL_LIKE):
                self.nul_only = False
            elif b"\0" in piece:
                self.has_nul = True
        if self.dropped or self.size + len(piece) > self.max_line:
            self.dropped += len(piece) + self.size
            self.parts, self.size = [], 0
            return
        self.parts.append(piece)
        self.size += len(piece)

    def take(self, number: int, offset: int) -> Line | None:
        """The line so far as a :class:`Line` (None for an empty one), and start a new line."""
        length = self.size + self.dropped
        if length == 0 or (self.nul_only and not self.has_nul):
            line = None  # empty, or white space only
        elif self.nul_only:
            line = Line(number, None, f"{length:,} NUL bytes skipped (a crash-time tail?)", offset)
        elif self.dropped:
            line = Line(number, None, f"a line of {length:,} bytes, longer than {self.max_line:,}, skipped",
                        offset)
        else:
            line = Line(number, b"".join(self.parts), None, offset)
        self.parts, self.size, self.dropped, self.nul_only, self.has_nul = [], 0, 0, True, False
        return line


def bounded_lines(fd: int, max_line: int = MAX_LINE_BYTES, chunk: int = _CHUNK) -> Iterator[Line]:
    """The lines of the open regular file ``fd``, none held beyond ``max_line`` bytes.

    Empty lines are not yielded; a line of only NUL bytes, an over-long line, and a hole of a sparse
    file come as a :class:`Line` with ``skipped`` set. Memory: at most ``max_line + chunk`` bytes.
    """
    position, number = 0, 1
    state = _LineState(max_line)
    while True:
        start = _next_data(fd, position)
        if start is None or start > position:  # a hole: NUL bytes never written
            end = os.fstat(fd).st_size if start is None else start
            line = state.take(number, position)
            if line is not None:
                yield line
            if end > position:
                yield Line(number, None, f"{end - position:,} NUL bytes of a sparse file's hole skipped "
                                         f"at byte {position:,}", end)
            if start is None:
                return
            position = start
            os.lseek(fd, position, os.SEEK_SET)
        data = os.read(fd, chunk)
        if not data:
            line = state.take(number, position)
            if line is not None:
                yield line
            return
        position += len(data)
        pieces = data.split(b"\n")
        for index, piece in enumerate(pieces):
            if piece:
                state.add(piece)
            if index < len(pieces) - 1:
                line = state.take(number, position)
                number += 1
                if line is not None:
                    yield line


class FileChange:
    """Whether a file changed since it was last looked at, by its inode, modification time and size (one
    ``stat``, links not followed): a watcher re-reads the file only then. A missing file is no change.
    The inode catches an atomic rewrite (a new file renamed over the old) of the same size within one
    tick of the file system's clock, which time and size alone miss."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None

    def changed(self) -> bool:
        """True once per new (inode, modification time, size) of :attr:`path`."""
        try:
            info = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        if key == self._seen:
            return False
        self._seen = key
        return True

    def forget(self) -> None:
        """The next :meth:`changed` is true while the file exists (read it again, unchanged or not)."""
        self._seen = None
