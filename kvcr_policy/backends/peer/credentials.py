"""Where peer secrets come from, and the tenants of a ``kvcr-policy serve``.

A process's own secret is, first found: ``security.secret`` (env, ``.env``, or a secrets
directory: pydantic-settings' sources, see :mod:`kvcr_policy.config.sources`), the file
``security.secret_file``, or the default file ``$XDG_CONFIG_HOME/kvcr-policy/peer.secret``
(``~/.config/...``). A server with none creates the default file, readable only by its user,
so that clients of the same user on the host find it with no configuration, and says where.

A server's tenants are the files of ``security.tenants_dir`` (file name = tenant, content =
its secret), or one tenant, ``default``, whose secret is the server's own. With
``security.insecure`` there is no secret: every client is the one tenant ``insecure``.

Secret files must be regular files (never followed through a link) owned by this user (or
root), closed to group and others, in a folder they cannot write
(:mod:`kvcr_policy.config.private_files`); a tenants folder must be closed to them too (mode 0700),
or they would learn the tenants' names.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from kvcr_policy.config.loading import LoadedConfig
from kvcr_policy.config.private_files import FileRefused, folder_problem, read_private
from kvcr_policy.config.schema import TENANT_NAME, TENANT_NAME_RULE, check_secret
from kvcr_policy.errors import ConfigError, ConfigIssue
from kvcr_policy.values import shorten

from .auth import key_id

__all__ = [
    "DEFAULT_TENANT",
    "INSECURE_TENANT",
    "ClientCredentials",
    "Keyring",
    "Tenant",
    "client_credentials",
    "client_secret",
    "default_secret_file",
    "secret_source",
    "server_keyring",
]

log = logging.getLogger("kvcr_policy.backends.peer.credentials")

INSECURE_TENANT = "insecure"
DEFAULT_TENANT = "default"


def default_secret_file() -> Path:
    """``$XDG_CONFIG_HOME/kvcr-policy/peer.secret``, ``~/.config/...`` when that is unset or
    relative (the XDG Base Directory spec: "If an implementation encounters a relative path in
    any of these variables it should consider the path invalid and ignore it")."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    if not os.path.isabs(base):
        base = str(Path.home() / ".config")
    return Path(base) / "kvcr-policy" / "peer.secret"


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant: its name and secret (and whether it may see every tenant's counts)."""

    name: str
    secret: bytes = field(repr=False)
    admin: bool = False


@dataclass(frozen=True)
class Keyring:
    """The tenants a server knows, by key id; ``insecure``: no authentication at all."""

    tenants: dict[bytes, Tenant]
    insecure: bool = False
    #: Where the server's secret came from, or was created (reported by ``serve``).
    source: str = ""
    created: Path | None = None
    #: Proofs for unknown key ids are computed with this, so a stranger learns nothing from
    #: the CHALLENGE about which key ids exist.
    decoy: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def find(self, key: bytes) -> Tenant | None:
        return self.tenants.get(key)

    def names(self) -> list[str]:
        if self.insecure:
            return [INSECURE_TENANT]
        return sorted(t.name for t in self.tenants.values())


def _problem(loaded: LoadedConfig, path: str, message: str) -> ConfigError:
    issue = ConfigIssue(path, loaded.origin(path), message)
    return ConfigError([issue], title="cannot use the peer secrets")


def _read_secret(path: Path, loaded: LoadedConfig, leaf: str) -> bytes:
    """The secret in the file at ``path``: a private regular file of this user or root, not a
    link, in a folder others cannot write
    (:func:`~kvcr_policy.config.private_files.read_private`)."""
    shown = shorten(str(path))
    try:
        text = read_private(path).decode("utf-8").strip()
    except FileRefused as err:
        raise _problem(loaded, leaf, str(err)) from None
    except UnicodeDecodeError:
        raise _problem(loaded, leaf, f"{shown} is not UTF-8 text") from None
    try:
        return check_secret(text).encode()
    except ValueError as err:
        raise _problem(loaded, leaf, f"{shown}: {err}") from None


def client_secret(loaded: LoadedConfig) -> tuple[bytes | None, str]:
    """This process's secret and where it came from (None, "" when there is none)."""
    security = loaded.config.security
    if security.secret is not None and security.secret_file is not None:
        message = (
            f"both security.secret (from {loaded.origin('security.secret')}) and "
            "security.secret_file are set; keep one"
        )
        raise _problem(loaded, "security.secret_file", message)
    if security.secret is not None:
        return security.secret.get_secret_value().encode(), loaded.origin("security.secret")
    if security.secret_file is not None:
        path = security.secret_file.expanduser()
        return _read_secret(path, loaded, "security.secret_file"), f"file {path}"
    path = default_secret_file()
    if path.exists():
        return _read_secret(path, loaded, "security.secret_file"), f"file {path}"
    return None, ""


@dataclass(frozen=True, slots=True)
class ClientCredentials:
    """What a client proves itself with: its secret (None: it has none) and where it came
    from; ``insecure``: it also accepts a peer that runs without authentication."""

    secret: bytes | None = field(default=None, repr=False)
    source: str = ""
    insecure: bool = False


def client_credentials(loaded: LoadedConfig) -> ClientCredentials:
    """This process's credentials as a client of a peer (read once, when a pipeline is built)."""
    secret, source = client_secret(loaded)
    return ClientCredentials(secret, source, loaded.config.security.insecure)


def _create_secret(path: Path) -> bytes:
    """A new secret in ``path`` (mode 0600, its folder 0700), or the one a racing process made.

    Written to a private temporary file and linked into place, so a reader never sees a
    partly written secret and two servers starting at once end with the same one.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    problem = folder_problem(path.parent)
    if problem is not None:  # others could swap the new secret for theirs
        raise FileRefused(f"cannot create a peer secret in {shorten(str(path))}: {problem}")
    text = secrets.token_urlsafe(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            return b""  # another process won: read its secret
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return text.encode()


def _tenants_dir(loaded: LoadedConfig, folder: Path) -> dict[bytes, Tenant]:
    leaf = "security.tenants_dir"
    shown = shorten(str(folder))
    try:
        info = folder.lstat()
        if stat.S_ISLNK(info.st_mode):
            message = f"{shown} is a symbolic link, which is never followed; name the folder itself"
            raise _problem(loaded, leaf, message)
        if not stat.S_ISDIR(info.st_mode):
            raise _problem(loaded, leaf, f"{shown} is not a directory")
        names = sorted(os.listdir(folder))
    except OSError as err:
        raise _problem(loaded, leaf, f"cannot read {shown}: {err.strerror}") from None
    if info.st_uid not in (os.geteuid(), 0):
        raise _problem(loaded, leaf, f"{shown} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o077:
        message = (
            f"{shown} can be read, listed or written by group or others (mode "
            f"{stat.S_IMODE(info.st_mode):04o}): they would learn the tenants' names; run "
            "chmod 700 on it"
        )
        raise _problem(loaded, leaf, message)
    admins = set(loaded.config.security.admin_tenants)
    tenants: dict[bytes, Tenant] = {}
    for name in names:
        if name.startswith("."):  # editors' and Kubernetes' own files (..data)
            continue
        if not TENANT_NAME.fullmatch(name):
            message = f"{shown}/{shorten(name)}: a tenant name is {TENANT_NAME_RULE}"
            raise _problem(loaded, leaf, message)
        secret = _read_secret(folder / name, loaded, leaf)
        key = key_id(secret)
        if key in tenants:
            message = f"tenants {tenants[key].name!r} and {name!r} have the same secret"
            raise _problem(loaded, leaf, message)
        tenants[key] = Tenant(name, secret, name in admins)
    if not tenants:
        raise _problem(loaded, leaf, f"{shown} holds no tenant file")
    unknown = admins - {t.name for t in tenants.values()}
    if unknown:
        message = f"names no tenant of security.tenants_dir: {', '.join(sorted(unknown))}"
        raise _problem(loaded, "security.admin_tenants", message)
    return tenants


def server_keyring(loaded: LoadedConfig, *, create: bool = True) -> Keyring:
    """The tenants a server accepts (see the module docstring); creates the default secret
    file when nothing is configured and ``create`` is true."""
    security = loaded.config.security
    if security.insecure:
        return Keyring({}, insecure=True, source="none (security.insecure)")
    if security.tenants_dir is not None:
        folder = security.tenants_dir.expanduser()
        return Keyring(_tenants_dir(loaded, folder), source=f"tenants_dir {folder}")
    secret, source = client_secret(loaded)
    created = None
    if secret is None:
        path = default_secret_file()
        if not create:
            raise _problem(loaded, "security.secret_file", f"no peer secret (none in {path})")
        try:
            secret, source = _create_secret(path), f"file {path}"
        except FileRefused as err:
            raise _problem(loaded, "security.secret_file", str(err)) from None
        if secret:
            created = path
            log.warning(
                "created a peer secret in %s (mode 0600, readable only by this user): clients "
                "of this user on this host find it there; give it to others through "
                "KVCR_POLICY_SECURITY__SECRET or security.secret_file",
                path,
            )
        else:  # another process created it first
            secret = _read_secret(path, loaded, "security.secret_file")
    admin = DEFAULT_TENANT in security.admin_tenants
    tenant = Tenant(DEFAULT_TENANT, secret, admin)
    return Keyring({key_id(secret): tenant}, source=source, created=created)


def secret_source(loaded: LoadedConfig) -> tuple[str, str]:
    """Where this process's peer secret will come from, as ``show`` prints it: a value
    (``<hidden>``, never the secret) and its source, in the order :func:`client_secret` and
    :func:`server_keyring` look; the secret itself is not read."""
    security = loaded.config.security
    if security.insecure:
        return "null", f"none: security.insecure (from {loaded.origin('security.insecure')})"
    if security.secret is not None:
        return "<hidden>", loaded.origin("security.secret")
    if security.secret_file is not None:
        path = security.secret_file.expanduser()
        return (
            "<hidden>",
            f"file {path} (security.secret_file, {loaded.origin('security.secret_file')})",
        )
    path = default_secret_file()
    if path.exists():
        return "<hidden>", f"file {path} (the default file)"
    return "null", f"none yet: serve creates {path} (the default file)"
