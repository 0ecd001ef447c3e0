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


# ---- red team 2026-12-b, B7: links, folder modes, a relative XDG_CONFIG_HOME -------------------


def test_a_default_secret_that_is_a_link_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    other = write_secret(tmp_path / "some-other-private-file")
    default_secret_file().parent.mkdir(mode=0o700)
    default_secret_file().symlink_to(other)
    with pytest.raises(ConfigError, match="is a symbolic link, which is never followed"):
        client_credentials(_load())
    with pytest.raises(ConfigError, match="is a symbolic link"):
        server_keyring(_load())


def test_a_tenant_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir(mode=0o700)
    write_secret(folder / "alice")
    (folder / "team-link").symlink_to(write_secret(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError, match="team-link' is a symbolic link"):
        server_keyring(_load(**{"security.tenants_dir": str(folder)}))


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701])
def test_a_tenants_folder_others_may_list_is_refused(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    write_secret(folder / "alice")
    folder.chmod(mode)
    with pytest.raises(ConfigError, match="they would learn the tenants' names; run chmod 700"):
        server_keyring(_load(**{"security.tenants_dir": str(folder)}))


def test_the_default_secret_in_a_folder_others_may_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    folder = default_secret_file().parent
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(ConfigError, match="can be written by group or others"):
        server_keyring(_load())  # it would have created the secret there
    write_secret(default_secret_file())
    with pytest.raises(ConfigError, match="can be written by group or others"):
        client_credentials(_load())


def test_a_relative_xdg_config_home_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/config")
    assert default_secret_file() == tmp_path / "home" / ".config" / "kvcr-policy" / "peer.secret"


def test_a_proc_file_is_no_secret_file() -> None:
    with pytest.raises(ConfigError, match=r"a /proc or /sys file"):
        client_credentials(_load(**{"security.secret_file": "/proc/self/environ"}))


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda f: os.mkfifo(f / "kvcr_policy_security__secret", 0o600), "is a FIFO"),
        (lambda f: (f / "kvcr_policy_security__secret").mkdir(), "is a directory"),
        (
            lambda f: (f / "kvcr_policy_security__secret").symlink_to(write_secret(f.parent / "x")),
            "a link out of the secrets directory",
        ),
    ],
    ids=["fifo", "directory", "link-out"],
)
def test_a_secrets_directory_entry_that_is_no_secret_file_is_an_error(
    tmp_path: Path, make: object, says: str
) -> None:
    """A FIFO there was skipped with a bare warning, and the process went on with the next
    source (red team 2026-12-b, B8)."""
    folder = tmp_path / "secrets"
    folder.mkdir(mode=0o700)
    make(folder)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=says) as info:
        load_config(environ={"KVCR_POLICY_SECRETS_DIR": str(folder)})
    assert "security.secret (from secrets " in str(info.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_secrets_directory_file_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    folder.mkdir(mode=0o700)
    path = write_secret(folder / "kvcr_policy_security__secret", mode=0o644)
    os.chown(path, 65534, 65534)
    with pytest.raises(ConfigError, match="belongs to another user"):
        load_config(environ={"KVCR_POLICY_SECRETS_DIR": str(folder)})


@pytest.mark.skipif(os.geteuid() != 0, reason="the mounted file is root's")
def test_a_kubernetes_secret_mount_is_read(tmp_path: Path) -> None:
    """Kubernetes mounts each secret as a link into the volume's ..data folder."""
    folder = tmp_path / "secrets"
    data = folder / "..2026_12_01" / "kvcr_policy_security__secret"
    data.parent.mkdir(parents=True, mode=0o755)
    folder.chmod(0o1777)
    write_secret(data, "mounted-secret-long-enough", mode=0o644)  # root-owned, as mounted
    (folder / "..data").symlink_to(data.parent.name)
    (folder / "kvcr_policy_security__secret").symlink_to("..data/kvcr_policy_security__secret")
    loaded = load_config(environ={"KVCR_POLICY_SECRETS_DIR": str(folder)})
    assert loaded.config.security.secret is not None
    assert loaded.config.security.secret.get_secret_value() == "mounted-secret-long-enough"
