"""Files a process trusts with its secrets or its configuration, and the rules they must meet.

A secret file (``security.secret_file``, the default ``peer.secret``, a tenant's file) is read
by :func:`read_private`:

- opened without following a symbolic link (``O_NOFOLLOW``): whoever can change a link
  chooses the secret, and a link to another private file of the user turns that file into a
  secret (or a tenant);
- a regular file (not a FIFO, which would block, a directory or a device), checked on the
  open descriptor (``fstat``), so what is checked is what is read;
- owned by this user or root, closed to group and others (a secret others can read
  authenticates them too); in a secrets directory mounted by a container runtime a file that
  root owns may be readable by others (Kubernetes mounts them 0644), as ``root_may_share`` says;
- 1 to :data:`MAX_PRIVATE_BYTES` bytes: ``/proc/self/environ`` passes every check above but
  reports a size of 0, as every ``/proc`` file does;
- in a folder that group and others cannot write, unless it is sticky (``/tmp``): in any other
  folder they could replace the file.

A ``.env`` file is configuration, not only secrets: :func:`dotenv_problem` holds one that the
user does not own, or that others may write, to the rules above, and one that sets any
``security.*`` value to all of them (it then holds the secret, a tenant folder, or ``insecure``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..values import shorten
from .user_files import FileRefused, open_fd, read_fd

__all__ = ["MAX_PRIVATE_BYTES", "FileRefused", "dotenv_problem", "folder_problem", "read_private"]

#: Largest secret file read: a secret has at most 4096 characters (4 bytes each in UTF-8).
MAX_PRIVATE_BYTES = 64 << 10


def _shown(path: Path | str) -> str:
    return shorten(str(path))


def _owner_problem(shown: str, info: os.stat_result) -> str | None:
    if info.st_uid in (os.geteuid(), 0):
        return None
    return f"{shown} belongs to another user (uid {info.st_uid})"


def folder_problem(folder: Path) -> str | None:
    """Why files in ``folder`` cannot be trusted: group or others may write it (and it is not
    sticky), so they could replace them; None when they cannot."""
    try:
        info = folder.stat()
    except OSError as err:
        return f"cannot read its folder {_shown(folder)}: {err.strerror}"
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        return (
            f"its folder {_shown(folder)} can be written by group or others (mode "
            f"{stat.S_IMODE(info.st_mode):04o}), who could replace the file; run chmod go-w on it"
        )
    return None


def read_private(path: Path, *, root_may_share: bool = False) -> bytes:
    """The bytes of the secret file at ``path`` (see the module docstring); FileRefused says why
    not."""
    shown = _shown(path)
    fd, info = open_fd(path, follow_links=False)  # a link is refused, as is a FIFO or device
    try:
        problem = _owner_problem(shown, info)
        if problem is not None:
            raise FileRefused(problem)
        shared = info.st_mode & 0o077
        if shared and not (root_may_share and info.st_uid == 0 and not info.st_mode & 0o022):
            message = (
                f"{shown} can be read or written by group or others (mode "
                f"{stat.S_IMODE(info.st_mode):04o}), so they could use it too; run chmod 600 on it"
            )
            raise FileRefused(message)
        if info.st_size == 0:
            message = f"{shown} is empty (or a /proc or /sys file, whose size reads 0)"
            raise FileRefused(message)
        if info.st_size > MAX_PRIVATE_BYTES:
            message = f"{shown} has {info.st_size} bytes, more than {MAX_PRIVATE_BYTES}"
            raise FileRefused(message)
        data = read_fd(fd, path, MAX_PRIVATE_BYTES)
    finally:
        os.close(fd)
    problem = folder_problem(path.parent)
    if problem is not None:
        raise FileRefused(f"{shown}: {problem}")
    return data


def dotenv_problem(path: Path, sets_security: bool) -> str | None:
    """Why the ``.env`` file at ``path`` may not configure this process (see the module
    docstring), or None."""
    shown = _shown(path)
    try:
        link, info = path.lstat(), path.stat()
    except OSError as err:
        return f"cannot read the .env file: {err.strerror}"
    for checked in (link, info):
        problem = _owner_problem(shown, checked)
        if problem is not None:
            return f"{problem}: a .env file configures the process that reads it; remove it"
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        return (
            f"{shown} can be written by group or others (mode {mode:04o}), who could configure "
            "this process; run chmod go-w on it"
        )
    if sets_security and mode & 0o077:
        return (
            f"{shown} sets security values and can be read by group or others (mode {mode:04o}); "
            "run chmod 600 on it"
        )
    if sets_security:
        return folder_problem(path.parent)
    return None
