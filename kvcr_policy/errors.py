"""The exception tree of kvcr_policy.

Every error a user can meet derives from :class:`KVCRPolicyError`; catching it catches them all::

    KVCRPolicyError
    ├── ConfigError            a load failed: all of its problems, each with where it came from
    ├── PluginError            a plugin failed to import or register, or a strategy name is unknown
    ├── SchemaDriftError       committed schemas/ files no longer match the code
    ├── UsageError             an API was called with the wrong kind or number of arguments
    ├── ArgumentError          an argument of the right kind holds a value the API cannot take
    ├── PoolError              a pool was refused: its tensor does not match its geometry
    │   └── IndicesError       indices are misaligned, out of range or of the wrong type
    ├── PlacementError         a `require`d placement (huge pages, NUMA) could not be had
    ├── OsCallError            a system call failed (``call`` and ``errno`` say which and why)
    ├── CapacityError          the tier has no free or evictable slot left
    │   └── TierMemoryError    a tier is larger than the memory this process can get
    ├── TransportError         a transfer failed (the pipeline turns it into misses)
    │   ├── UnsupportedError   the transport cannot do what the config asks (coalesce, split)
    │   │   └── CudaUnavailableError   the cuda transport where no CUDA device is visible
    │   ├── ProtocolError      a peer sent a malformed, truncated or oversize frame
    │   ├── AuthenticationError   a peer refused our secret, or could not prove it holds it
    │   └── BackendUnavailableError   the tier cannot be reached (a peer gone or not answering)
    ├── UnimplementedError     an engine API that this backend deliberately does not provide
    ├── BenchError             a benchmark could not run or its bytes did not verify
    │   └── TuneError          ``tune`` could not run: an input, the budget, no candidate measured
    ├── ReplayError            ``replay`` could not run a trace through an engine, or it failed
    └── ClosedError            a call reached an object that is closing or closed

Where a built-in exception type is what callers of a Python API expect, the class derives from
it too (``UsageError`` is a ``TypeError``, ``ArgumentError`` a ``ValueError``, ``OsCallError``
an ``OSError``), so ``except ValueError`` keeps working while ``except KVCRPolicyError`` catches
everything.

Messages say what is wrong, where the value came from, what was expected, what was given and how
to fix it; they are bound first and then raised, so the text is what a user reads.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_LINE",
    "MAX_SHOWN",
    "ArgumentError",
    "AuthenticationError",
    "BackendUnavailableError",
    "BenchError",
    "CapacityError",
    "ClosedError",
    "ConfigError",
    "ConfigIssue",
    "ConformanceError",
    "CudaUnavailableError",
    "IndicesError",
    "KVCRPolicyError",
    "OsCallError",
    "PlacementError",
    "PluginError",
    "PoolError",
    "ProtocolError",
    "ReplayError",
    "SchemaDriftError",
    "TierMemoryError",
    "TransportError",
    "TuneError",
    "UnimplementedError",
    "UnsupportedError",
    "UsageError",
    "mismatch",
]


#: Longest line of an error's text: a value quoted in a message (a 50 MB strategy name, say)
#: is cut in the middle rather than echoed whole on a terminal or in a log.
MAX_LINE = 1000


def _cut_line(line: str, limit: int = MAX_LINE) -> str:
    """``line``, or its head and tail around a note of how much was cut."""
    if len(line) <= limit:
        return line
    head, tail = line[: limit * 2 // 3], line[-(limit // 4) :]
    return f"{head} ... [{len(line) - len(head) - len(tail)} characters cut] ... {tail}"


class KVCRPolicyError(Exception):
    """Base of every error raised by kvcr_policy. Its text never holds a line longer than
    :data:`MAX_LINE` characters, whatever value a message quotes."""

    def __str__(self) -> str:
        text = super().__str__()
        if len(text) <= MAX_LINE:
            return text
        return "\n".join(map(_cut_line, text.split("\n")))


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem found while loading: the dotted path, where it came from, and the text."""

    path: str
    origin: str
    message: str

    def render(self) -> str:
        return f"{self.path} (from {self.origin}): {self.message}"


#: Problems a :class:`ConfigError` message lists; ``issues`` holds them all.
MAX_SHOWN = 64


class ConfigError(KVCRPolicyError, ValueError):
    """A configuration load failed; ``issues`` holds every problem found by that load."""

    def __init__(self, issues: Sequence[ConfigIssue], *, title: str = "invalid configuration"):
        self.issues: tuple[ConfigIssue, ...] = tuple(issues)
        count = len(self.issues)
        head = f"{title}: {count} problem{'s' if count != 1 else ''}"
        lines = [f"  - {issue.render()}" for issue in self.issues[:MAX_SHOWN]]
        if count > MAX_SHOWN:  # the message stays readable (and bounded) however many there are
            lines.append(f"  - ... and {count - MAX_SHOWN} more (fix these first)")
        body = "\n".join(lines)
        super().__init__(f"{head}\n{body}" if body else head)


def mismatch(path: str, origin: str, message: str) -> ConfigError:
    """A backend's refusal of a setting that does not fit it, as a :class:`ConfigError`.

    ``path`` is the setting (``transport.name``), ``origin`` where its value came from and
    ``message`` what the backend needs and how to fix it.
    """
    return ConfigError([ConfigIssue(path, origin, message)], title="the backend cannot run so")


class PluginError(KVCRPolicyError):
    """A plugin failed to import or register, or a configured strategy name is unknown.

    ``plugin`` is the name of the plugin at fault (its entry-point name, or ``builtin.<module>``)
    and ``distribution`` the distribution that ships it; both are None when the error is not
    about one plugin (a name that nothing registered).
    """

    def __init__(
        self, message: str, *, plugin: str | None = None, distribution: str | None = None
    ) -> None:
        super().__init__(message)
        self.plugin = plugin
        self.distribution = distribution


class SchemaDriftError(KVCRPolicyError):
    """The committed files under schemas/ disagree with the code."""


class PoolError(KVCRPolicyError, ValueError):
    """A pool was refused because its tensor does not match its geometry."""


class IndicesError(PoolError):
    """Host indices are misaligned, out of range, or of the wrong type for a pool."""


class PlacementError(KVCRPolicyError):
    """A placement asked for with `require` (huge pages, NUMA binding) could not be obtained."""


class CapacityError(KVCRPolicyError):
    """The tier has no free slot and nothing that may be evicted."""


class TierMemoryError(CapacityError):
    """A tier is larger than the memory this process can get (a memory cgroup's limit, the
    host's memory, the address-space limit), found before anything is mapped: the message
    names ``placement.capacity_bytes``, its origin, what is available, the limit that binds
    (and the file it was read from) and the fix."""


class TransportError(KVCRPolicyError):
    """A transfer failed; the pipeline retries or reports the affected pages as misses."""


class UnsupportedError(TransportError):
    """The transport cannot do what the configuration asks (coalescing, split sizing)."""


class ProtocolError(TransportError):
    """A peer sent a frame that is malformed, truncated, oversize or of an unknown version."""


class AuthenticationError(TransportError):
    """A peer refused this process's secret, or could not prove that it holds the same one."""


class BackendUnavailableError(TransportError):
    """The tier backend cannot be reached: a peer went away or did not answer in time."""


class ClosedError(KVCRPolicyError, RuntimeError):
    """A call reached a pipeline, tier, transport or server that is closing or closed."""


class UsageError(KVCRPolicyError, TypeError):
    """An API was called with the wrong kind or number of arguments."""


class ArgumentError(KVCRPolicyError, ValueError):
    """An argument of the right kind holds a value the API cannot take."""


class OsCallError(KVCRPolicyError, OSError):
    """A system call failed; ``call`` names it, ``errno`` says why, the message says both."""

    def __init__(self, call: str, err: int, detail: str = "") -> None:
        name = errno.errorcode.get(err, f"errno {err}")
        text = f"{call} failed with {name} ({os.strerror(err)})"
        super().__init__(err, f"{text}: {detail}" if detail else text)
        self.call = call


class CudaUnavailableError(UnsupportedError):
    """The cuda transport was asked for where torch sees no CUDA device."""


class UnimplementedError(KVCRPolicyError, NotImplementedError):
    """An engine API that this backend deliberately does not provide (it says what instead)."""


class BenchError(KVCRPolicyError):
    """A benchmark could not run (bad arguments, missing dependency) or did not verify."""


class ReplayError(KVCRPolicyError):
    """``replay`` cannot run as asked (an input, a missing engine) or an engine run failed."""


class ConformanceError(KVCRPolicyError, AssertionError):
    """A backend broke the tier-backend seam's contract (:mod:`kvcr_policy.testing`)."""


class TuneError(BenchError):
    """``tune`` cannot run as asked: an input, the budget, or no candidate could be measured."""
