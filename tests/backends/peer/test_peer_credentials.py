"""Where secrets come from and what a server's tenants are (no UCX needed)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from kvcr_policy import load_config
from kvcr_policy.backends.peer import auth
from kvcr_policy.backends.peer.credentials import (
    client_credentials,
    default_secret_file,
    server_keyring,
)
from kvcr_policy.errors import ConfigError
from tests.backends.peer.tenants import write_secret


def _load(**overrides: object) -> object:
    return load_config(environ={}, overrides=overrides)


def test_a_tenants_directory_names_each_tenant_by_its_file(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir(mode=0o700)
    alice, bob = write_secret(folder / "alice"), write_secret(folder / "bob")
    (folder / "..data").mkdir()  # Kubernetes' own entries are skipped
    keyring = server_keyring(
        _load(**{"security.tenants_dir": str(folder), "security.admin_tenants": ["bob"]})
    )
    by_name = {t.name: t for t in keyring.tenants.values()}
    assert sorted(by_name) == ["alice", "bob"] and by_name["bob"].admin
    secret = alice.read_text().strip().encode()
    assert keyring.find(auth.key_id(secret)) == by_name["alice"]
    assert keyring.find(auth.key_id(b"x" * 32)) is None
    assert bob.read_text().strip().encode() != secret


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        (lambda f: write_secret(f / "bad name!"), "a tenant name is 1..64"),
        (lambda f: [write_secret(f / n, "same-secret-for-both-x") for n in ("a", "b")], "same"),
        (lambda f: write_secret(f / "short", "tooshort"), "16 to 4096 characters"),
        (lambda f: write_secret(f / "open", mode=0o640), "chmod 600"),
        (lambda f: None, "holds no tenant file"),
    ],
)
def test_a_bad_tenants_directory_is_a_config_error(
    tmp_path: Path, setup: object, says: str
) -> None:
    folder = tmp_path / "t"
    folder.mkdir(mode=0o700)
    setup(folder)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=says) as info:
        server_keyring(_load(**{"security.tenants_dir": str(folder)}))
    assert "security.tenants_dir (from override)" in str(info.value)


def test_an_admin_that_is_no_tenant_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir(mode=0o700)
    write_secret(folder / "alice")
    overrides = {"security.tenants_dir": str(folder), "security.admin_tenants": ["root"]}
    with pytest.raises(ConfigError, match="names no tenant"):
        server_keyring(_load(**overrides))


def test_the_default_secret_is_created_once_even_by_racing_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert client_credentials(_load()).secret is None  # nothing yet
    rings: list[object] = []
    threads = [
        threading.Thread(target=lambda: rings.append(server_keyring(_load()))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    path = default_secret_file()
    assert path == tmp_path / "kvcr-policy" / "peer.secret"
    assert os.stat(path).st_mode & 0o777 == 0o600
    keys = {next(iter(ring.tenants)) for ring in rings}  # type: ignore[attr-defined]
    assert len(keys) == 1  # every server ended with the same secret
    assert sum(ring.created is not None for ring in rings) == 1  # type: ignore[attr-defined]
    assert client_credentials(_load()).secret == path.read_text().strip().encode()
    assert sorted(p.name for p in path.parent.iterdir()) == ["peer.secret"]  # no temp left


def test_secret_and_secret_file_together_are_refused(tmp_path: Path) -> None:
    loaded = load_config(
        environ={"KVCR_POLICY_SECURITY__SECRET": "a-secret-long-enough"},
        overrides={"security.secret_file": str(write_secret(tmp_path / "s"))},
    )
    with pytest.raises(ConfigError, match="keep one"):
        client_credentials(loaded)
