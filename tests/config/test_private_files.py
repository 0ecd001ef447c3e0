"""The rules for files a process trusts (red team 2026-12-b, B6 and B7): a secret file is a
private regular file of this user or root, never reached through a link, in a folder others
cannot write; a ``.env`` that another user owns or may write, or that sets security values and
others may read, configures nothing. The suite runs as root in CI: another owner is uid 65534."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvcr_policy.config.private_files import FileRefused, dotenv_problem, read_private
from tests.backends.peer.tenants import write_secret

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def _folder(tmp_path: Path, mode: int = 0o700) -> Path:
    folder = tmp_path / "f"
    folder.mkdir()
    folder.chmod(mode)
    return folder


def _private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def test_a_private_file_is_read(tmp_path: Path) -> None:
    path = write_secret(_folder(tmp_path) / "s", "a-secret-long-enough")
    assert read_private(path).strip() == b"a-secret-long-enough"


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda f: os.symlink(write_secret(f / "real"), f / "s"), "is a symbolic link"),
        (lambda f: os.mkfifo(f / "s", 0o600), "is a FIFO, not a regular file"),
        (lambda f: (f / "s").mkdir(mode=0o700), "is a directory, not a regular file"),
        (lambda f: write_secret(f / "s", mode=0o644), "run chmod 600"),
        (lambda f: os.chown(write_secret(f / "s"), NOBODY, NOBODY), "belongs to another user"),
        (lambda f: _private(f / "s", b""), "is empty"),
        (lambda f: _private(f / "s", b"x" * (1 << 17)), "bytes, more"),
    ],
    ids=["link", "fifo", "directory", "shared", "foreign", "empty", "huge"],
)
def test_a_file_that_is_no_private_secret_is_refused(
    tmp_path: Path, make: object, says: str
) -> None:
    folder = _folder(tmp_path)
    make(folder)  # type: ignore[operator]
    with pytest.raises(FileRefused, match=says):
        read_private(folder / "s")


def test_a_proc_file_is_no_secret() -> None:
    with pytest.raises(FileRefused, match=r"a /proc or /sys file"):
        read_private(Path("/proc/self/environ"))


def test_a_folder_others_may_write_is_refused_unless_sticky(tmp_path: Path) -> None:
    folder = _folder(tmp_path, 0o777)
    write_secret(folder / "s")
    with pytest.raises(FileRefused, match="can be written by group or others"):
        read_private(folder / "s")
    folder.chmod(0o1777)  # /tmp: others cannot replace a file they do not own
    assert read_private(folder / "s")


def test_root_may_share_a_mounted_secret_but_not_let_others_write_it(tmp_path: Path) -> None:
    path = write_secret(_folder(tmp_path) / "s", mode=0o644)
    assert read_private(path, root_may_share=True)  # Kubernetes' default mount: root, 0644
    path.chmod(0o666)
    with pytest.raises(FileRefused, match="chmod 600"):
        read_private(path, root_may_share=True)


@pytest.mark.parametrize(
    ("mode", "owner", "security", "says"),
    [
        (0o644, 0, False, None),
        (0o600, 0, True, None),
        (0o644, 0, True, "sets security values and can be read by group or others"),
        (0o666, 0, False, "can be written by group or others"),
        (0o600, NOBODY, False, "belongs to another user"),
    ],
)
def test_a_dotenv_is_trusted_only_when_its_owner_and_mode_say_so(
    tmp_path: Path, mode: int, owner: int, security: bool, says: str | None
) -> None:
    path = _folder(tmp_path) / ".env"
    path.write_text("KVCR_POLICY_BATCHING__READ_BATCH_PAGES=64\n")
    path.chmod(mode)
    os.chown(path, owner, owner)
    problem = dotenv_problem(path, security)
    assert (problem is None) if says is None else (problem is not None and says in problem)
