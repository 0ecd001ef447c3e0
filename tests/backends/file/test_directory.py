"""A pool's directory: direct I/O probed for real (and its fallback where a file system
refuses O_DIRECT), one process at a time, its format kept, the free-space floor."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcr_policy.backends.file import directory
from kvcr_policy.backends.file.directory import fit_capacity, open_files, probe_direct
from kvcr_policy.errors import CapacityError, ConfigError
from tests.backends.file.tiers import small_geometry


def test_direct_io_is_probed_with_a_real_write_and_read(tmp_path: Path) -> None:
    # tmp_path's file system decides (ext4 and tmpfs since Linux 6.6 do O_DIRECT).
    try:
        fd = os.open(tmp_path / "x", os.O_RDWR | os.O_CREAT | os.O_DIRECT)
        os.close(fd)
        can = True
    except OSError:
        can = False
    assert probe_direct(tmp_path) is can


def test_a_file_system_without_o_direct_falls_back_or_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Faked: every file system here does O_DIRECT (tmpfs too, since Linux 6.6); older tmpfs
    # and some FUSE file systems answer open(O_DIRECT) with EINVAL, as this does.
    real_open = os.open

    def no_direct(path: object, flags: int, *args: object) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(directory.os, "open", no_direct)
    files = open_files(tmp_path / "a", small_geometry(), "auto")
    assert not files.direct
    files.close()
    with pytest.raises(ConfigError, match="does not do direct I/O"):
        open_files(tmp_path / "b", small_geometry(), "on")


def test_a_second_process_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    files = open_files(tmp_path, small_geometry(), "auto")
    try:
        code = (
            "import sys; from pathlib import Path\n"
            "from kvcr_policy.backends.file.directory import open_files\n"
            "from tests.backends.file.tiers import small_geometry\n"
            "open_files(Path(sys.argv[1]), small_geometry(), 'auto')\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True
        )
        assert done.returncode != 0
        assert f"in use by another process (pid {os.getpid()})" in done.stderr
    finally:
        files.close()
    open_files(tmp_path, small_geometry(), "auto").close()  # free again once closed


def test_a_directory_of_another_format_is_refused(tmp_path: Path) -> None:
    open_files(tmp_path, small_geometry(), "auto").close()
    (tmp_path / "format.json").write_text('{"format": 1, "page_bytes": 1, "stride": 4096}')
    with pytest.raises(ConfigError, match="holds another format"):
        open_files(tmp_path, small_geometry(), "auto")


def test_the_free_space_floor_caps_the_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = open_files(tmp_path, small_geometry(), "auto")
    try:
        # Injected: the free space of the moment is the machine's, not the test's.
        monkeypatch.setattr(directory, "free_bytes", lambda path: 10 * 4096 + 1000)
        assert fit_capacity(files, 100, floor=0) == 10
        assert fit_capacity(files, 100, floor=4 * 4096) == 6
        assert fit_capacity(files, 3, floor=0) == 3
        with pytest.raises(CapacityError, match="free-space floor"):
            fit_capacity(files, 100, floor=11 * 4096)
    finally:
        files.close()
