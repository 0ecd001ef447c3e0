"""Reading a file a user names: the one reader of every file kvcr_policy reads from a user.

Profiles and their bases, ``@FILE`` in the SGLang flag and in its ``overrides``, ``plan --trace``
files, ``.env`` files and secret files (:mod:`.private_files` adds its own rules on top) are all
opened here, by the same rules:

- a regular file only, checked on the open descriptor (``fstat``), so what is checked is what
  is read. The open itself never blocks: it is made with ``O_NONBLOCK`` (``open(2)``: a FIFO
  opened for reading with it returns at once instead of waiting for a writer), and a FIFO, a
  device (``/dev/zero`` never ends), a socket or a directory is then refused by kind;
- at most a cap of bytes, enforced on what is read and not only on the size ``fstat`` reports
  (``/proc`` files report 0 and hold more);
- an error names the file and the rule broken, never the file's content: the file may hold a
  secret, and an error goes to logs that others read. Callers keep to this too (a parser's
  message that quotes the text is cut to its position: :func:`parse_problem`).

:class:`FileRefused` (a :class:`ValueError`) says why a file is not read; each caller turns it
into its own error (a :class:`~kvcr_policy.errors.ConfigIssue`, an
:class:`~kvcr_policy.errors.ArgumentError`) naming where the file was named.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Any

from ..values import shorten

__all__ = [
    "MAX_CONFIG_BYTES",
    "FileRefused",
    "file_kind",
    "open_regular",
    "parse_problem",
    "read_regular",
]

#: Largest configuration file read (a profile, an overrides or flag file, a ``.env`` file): the
#: bundled profiles hold about 2 KiB; 1 MiB is room for any real one, not for a runaway.
MAX_CONFIG_BYTES = 1 << 20


class FileRefused(ValueError):
    """A file or folder that is not read; the message says why and how to fix it, ``reason``
    the why alone (``No such file or directory``, ``a FIFO, not a regular file``), for a
    caller that names the file its own way."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


def shown(path: Path | str) -> str:
    """A path as a message shows it (cut to a sane length)."""
    return shorten(str(path))


def file_kind(mode: int) -> str:
    """What a file of ``mode`` is, for a message: ``a FIFO``, ``a directory``, ..."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_fd(path: Path | str, *, follow_links: bool = True) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at ``path`` (blocking reads) and its ``fstat``; the
    caller closes it. FileRefused says why not (see the module docstring)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_links:
            message = (
                f"{shown(path)} is a symbolic link, which is never followed to a secret (whoever "
                "can change the link would choose it); name the file itself"
            )
            raise FileRefused(message) from None
        reason = err.strerror or type(err).__name__
        raise FileRefused(f"cannot read {shown(path)}: {reason}", reason) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            reason = f"{file_kind(info.st_mode)}, not a regular file"
            raise FileRefused(f"{shown(path)} is {reason}", reason)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_fd(fd: int, path: Path | str, limit: int) -> bytes:
    """At most ``limit`` bytes of the open file ``fd``; FileRefused if it holds more."""
    chunks: list[bytes] = []
    left = limit + 1
    try:
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise FileRefused(f"cannot read {shown(path)}: {reason}", reason) from None
    if left <= 0:
        reason = f"more than {limit} bytes, the most read from such a file"
        raise FileRefused(f"{shown(path)} holds {reason}", reason)
    return b"".join(chunks)


def read_regular(path: Path | str, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them (module docstring)."""
    fd, _ = open_fd(path)
    try:
        return read_fd(fd, path, limit)
    finally:
        os.close(fd)


def open_regular(path: Path | str) -> IO[bytes]:
    """The regular file at ``path`` open for reading in binary (module docstring); the caller
    bounds what it reads and closes it."""
    fd, _ = open_fd(path)
    return os.fdopen(fd, "rb")


def parse_problem(err: BaseException) -> str:
    """A parser's error without the text it quotes: PyYAML's marked errors show the line
    (which may hold a secret), so only their problem and position are kept."""
    problem = getattr(err, "problem", None)
    mark: Any = getattr(err, "problem_mark", None)
    if problem is not None and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    if isinstance(err, RecursionError):
        return "nested too deeply to read"
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text ({err.reason} at byte {err.start})"
    return str(err)
