"""Every file kvcr_policy reads from a user goes through one reader: a FIFO, a device or a file
over the cap is refused at once with one message, through every entry point (red team
2026-12-c, C6: a FIFO as an SGLang ``@FILE`` hung SGLang's start, ``/dev/zero`` grew it until it
was killed).

Each entry point runs in a child process under a 2 GiB address-space limit and a timeout, so a
reader that follows a FIFO or reads a device fails the test instead of hanging or exhausting
the machine that runs it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from kvcr_policy.config.user_files import MAX_CONFIG_BYTES, FileRefused, read_regular
from tests.support.paths import ROOT

#: Each entry point, given the file's path as PATH; the file's extension is the key's second part.
READERS = {
    "flag.json": "from kvcr_policy.integrations.sglang.flag import read_flag\n"
    "read_flag('@' + PATH)",
    "overrides.yaml": "from kvcr_policy.integrations.sglang.config import parse_extra_config\n"
    "parse_extra_config({'overrides': '@' + PATH})",
    "profile.toml": "from kvcr_policy import load_config\n"
    "load_config(PATH, environ={}, dotenv=False)",
    "base.toml": "import pathlib\n"
    "from kvcr_policy import load_config\n"
    "top = pathlib.Path(PATH).with_name('top.toml')\n"
    "top.write_text(f'[profile]\\nbase = {PATH!r}\\n')\n"
    "load_config(top, environ={}, dotenv=False)",
    "dotenv.env": "from kvcr_policy import load_config\nload_config(None, environ={}, dotenv=PATH)",
    "trace.jsonl": "from kvcr_policy.plan.trace import read_trace\nread_trace(PATH)",
    "trace.jsonl.gz": "from kvcr_policy.plan.trace import read_trace\nread_trace(PATH)",
}

CHILD = """
import json, sys
from kvcr_policy.errors import KVCRPolicyError
PATH = sys.argv[1]
try:
{code}
    print(json.dumps({{"read": True}}))
except (KVCRPolicyError, ValueError) as err:
    print(json.dumps({{"error": type(err).__name__, "message": str(err)}}))
"""


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def run_reader(reader: str, path: Path) -> dict[str, object]:
    code = "\n".join("    " + line for line in READERS[reader].splitlines())
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(code=code), str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=_limited,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{reader}: still reading {path} after 120 s (it followed a FIFO or a device)")
    assert done.returncode == 0 and done.stdout, f"{reader}: exit {done.returncode}\n{done.stderr}"
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def _fifo(folder: Path, name: str) -> Path:
    os.mkfifo(folder / name, 0o600)
    return folder / name


def _device(folder: Path, name: str) -> Path:
    os.symlink("/dev/zero", folder / name)
    return folder / name


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize(
    ("make", "says"),
    [(_fifo, "a FIFO, not a regular file"), (_device, "a character device, not a regular file")],
    ids=["fifo", "dev-zero"],
)
def test_every_user_file_that_is_not_a_regular_file_is_refused_at_once(
    tmp_path: Path, reader: str, make: object, says: str
) -> None:
    path = make(tmp_path, "x." + reader.split(".", 1)[1])  # type: ignore[operator]
    result = run_reader(reader, path)
    assert "error" in result, f"{reader} read {path}"
    assert says in str(result["message"]), result


@pytest.mark.parametrize("reader", sorted(r for r in READERS if not r.startswith("trace")))
def test_every_configuration_file_over_the_cap_is_refused(tmp_path: Path, reader: str) -> None:
    """A megabyte of comments, or of blanks: nothing a real configuration file holds."""
    suffix = reader.split(".", 1)[1]
    filler = b" " if suffix == "json" else b"#"
    path = tmp_path / f"big.{suffix}"
    path.write_bytes(filler * (MAX_CONFIG_BYTES + 1))
    path.chmod(0o600)
    result = run_reader(reader, path)
    assert f"more than {MAX_CONFIG_BYTES} bytes" in str(result.get("message")), result


def test_the_reader_reads_what_the_file_holds_and_never_shows_it(tmp_path: Path) -> None:
    path = tmp_path / "secret.txt"
    path.write_bytes(b"rt3-SECRET-5555" * 8)
    assert read_regular(path) == b"rt3-SECRET-5555" * 8
    with pytest.raises(FileRefused, match="more than 16 bytes") as refused:
        read_regular(path, limit=16)
    assert "SECRET" not in str(refused.value)
    # A /proc file reports a size of 0 and holds more: the cap holds on what is read.
    assert read_regular("/proc/self/status", limit=1 << 16).startswith(b"Name:")
    with pytest.raises(FileRefused, match="more than 8 bytes"):
        read_regular("/proc/self/status", limit=8)
    with pytest.raises(FileRefused, match="a directory, not a regular file"):
        read_regular(tmp_path)
    with pytest.raises(FileRefused, match="No such file or directory"):
        read_regular(tmp_path / "missing")
