"""A secrets directory: one private file per secret leaf, never echoed."""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import ConfigIssue
from ...values import shorten
from ..private_files import FileRefused, folder_problem, read_private
from ..provenance import secrets_origin
from ..schema import ENV_PREFIX
from .common import (
    SECRET_LEAVES,
    Leaves,
    env_name,
)


def secrets_source(directory: Path) -> tuple[Leaves, list[ConfigIssue]]:
    """Secret leaves from the files of a secrets directory, as Docker and Kubernetes mount
    secrets: one file per field, named ``kvcr_policy_security__<field>`` (any case).

    pydantic-settings' ``SecretsSettingsSource`` reads such a folder, but skips a FIFO with a
    bare warning (the process then goes on with the next source), follows a link anywhere and
    takes any owner and mode; here each file is held to the secret-file rules
    (:func:`~kvcr_policy.config.private_files.read_private`), except that root may let others
    read it
    (Kubernetes mounts secrets 0644) and a link is followed within the folder (Kubernetes
    mounts each secret as a link into its ``..data`` folder).
    """
    where = f"env {ENV_PREFIX}SECRETS_DIR"
    shown = shorten(str(directory))
    if not directory.is_dir():
        reason = "is not a directory" if directory.exists() else "does not exist"
        return {}, [ConfigIssue("<secrets>", where, f"the secrets directory {shown} {reason}")]
    try:
        entries = os.listdir(directory)
        inside = directory.resolve()
    except OSError as err:
        message = f"cannot read the secrets directory {shown}: {err.strerror}"
        return {}, [ConfigIssue("<secrets>", where, message)]
    problem = folder_problem(directory)
    if problem is not None:
        return {}, [ConfigIssue("<secrets>", where, f"the secrets directory: {problem}")]
    leaves: Leaves = {}
    issues: list[ConfigIssue] = []
    for path in sorted(SECRET_LEAVES):
        name = env_name(path).lower()
        found = sorted(entry for entry in entries if entry.lower() == name)
        if not found:
            continue
        file = directory / found[0]
        origin = secrets_origin(str(file))
        try:
            if len(found) > 1:
                raise FileRefused(f"{', '.join(found)} in {shown} all name {path}; keep one")
            real = file.resolve()
            if not real.is_relative_to(inside):
                message = f"{shorten(str(file))} is a link out of the secrets directory"
                raise FileRefused(message)
            text = read_private(real, root_may_share=True).decode("utf-8").strip()
        except FileRefused as err:
            issues.append(ConfigIssue(path, origin, str(err)))
            continue
        except (OSError, UnicodeDecodeError) as err:
            reason = str(err.strerror) if isinstance(err, OSError) else "not UTF-8 text"
            issues.append(ConfigIssue(path, origin, f"cannot read {shorten(str(file))}: {reason}"))
            continue
        leaves[path] = (text, origin)
    return leaves, issues
