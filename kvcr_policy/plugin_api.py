"""The plugin API: every name a plugin may import from kvcr_policy, exported from one place.

A plugin (a strategy, a tier backend, a bench adapter) imports from here, or from the package
itself (:data:`MODULES`), and from nothing else of kvcr_policy: the rest (the ``dram`` and
``peer`` backends, ``bench``, ``cli``, the modules these names are defined in) may move or
change without notice. A test checks that the plugins shipped with kvcr_policy keep to this
list, and import-linter forbids them the backend packages, ``bench`` and ``cli``.

- registering: :func:`hookimpl`, the ``register`` callbacks' types (hooks in
  :mod:`kvcr_policy.hookspecs`) and :class:`Lazy` (a factory whose module is imported only
  when something is built);
- strategies: the protocols of :mod:`kvcr_policy.strategies` and the config sections;
- backends: the seam of :mod:`kvcr_policy.backends.base` (read its docstring first),
  descriptors, geometry, placed memory (:class:`Region`, opened by the placement strategy),
  staging pages through a contiguous area (:mod:`kvcr_policy.backends.staging`);
- benchmarking: :class:`BenchBackend` (:mod:`kvcr_policy.bench_adapter`);
- errors: the whole tree of :mod:`kvcr_policy.errors`.
"""

from __future__ import annotations

from .backends.base import (
    BackendContext,
    ConfiguredTransport,
    EarlyRead,
    Endpoint,
    PoolReadsEarly,
    PoolSpec,
    PoolTier,
    PublishesEarly,
    ReadTransfer,
    Shape,
    TierBackend,
    Transfer,
    WriteTransfer,
    check_device,
)
from .backends.reporting import BackendReporting, PoolReporting, TierUsage
from .backends.staging import (
    PagePlanes,
    StagingArea,
    fragment_planes,
    packed,
    stages_pages,
    staging_below_field,
    staging_bytes_field,
    staging_pages,
)
from .bench_adapter import BenchBackend, BenchSetup, Pipeline
from .config.fields import number_field, size_field
from .config.hosts import host_part, host_port
from .config.schema import (
    AdmissionSection,
    BatchingSection,
    CoalescingSection,
    EvictionSection,
    PlacementSection,
    PolicyConfig,
    strategy_name,
)
from .config.tunable import tunable
from .descriptors import Descriptors, build_descriptors, coalesce
from .errors import (
    ArgumentError,
    BackendUnavailableError,
    BenchError,
    CapacityError,
    ClosedError,
    ConfigError,
    ConfigIssue,
    IndicesError,
    KVCRPolicyError,
    PlacementError,
    PluginError,
    PoolError,
    TierMemoryError,
    TransportError,
    UnsupportedError,
    mismatch,
)
from .geometry import PoolGeometry, fragment_offsets
from .hookspecs import hookimpl
from .keys import key_part
from .memory import DeviceLocality, PlacementAudit, Region
from .registry import (
    Lazy,
    NoOptions,
    RegisterBackend,
    RegisterBenchBackend,
    RegisterStrategy,
    RegisterTransport,
)
from .strategies import (
    Admission,
    AdmissionStrategy,
    BatchingStrategy,
    CoalescingStrategy,
    EvictionPolicy,
    EvictionStrategy,
    FallbackStrategy,
    PlacementStrategy,
    RestoreOutlook,
    ThreadTuningStrategy,
    Window,
    follow_coalescing,
)
from .values import Size

#: The modules a plugin may import names from: this one, and the package's face
#: (``load_config``, ``build_pipeline``, ``hookimpl``); every other module may move.
MODULES = ("kvcr_policy", "kvcr_policy.plugin_api")

__all__ = [
    "MODULES",
    "Admission",
    "AdmissionSection",
    "AdmissionStrategy",
    "ArgumentError",
    "BackendContext",
    "BackendReporting",
    "BackendUnavailableError",
    "BatchingSection",
    "BatchingStrategy",
    "BenchBackend",
    "BenchError",
    "BenchSetup",
    "CapacityError",
    "ClosedError",
    "CoalescingSection",
    "CoalescingStrategy",
    "ConfigError",
    "ConfigIssue",
    "ConfiguredTransport",
    "Descriptors",
    "DeviceLocality",
    "EarlyRead",
    "Endpoint",
    "EvictionPolicy",
    "EvictionSection",
    "EvictionStrategy",
    "FallbackStrategy",
    "IndicesError",
    "KVCRPolicyError",
    "Lazy",
    "NoOptions",
    "PagePlanes",
    "Pipeline",
    "PlacementAudit",
    "PlacementError",
    "PlacementSection",
    "PlacementStrategy",
    "PluginError",
    "PolicyConfig",
    "PoolError",
    "PoolGeometry",
    "PoolReadsEarly",
    "PoolReporting",
    "PoolSpec",
    "PoolTier",
    "PublishesEarly",
    "ReadTransfer",
    "Region",
    "RegisterBackend",
    "RegisterBenchBackend",
    "RegisterStrategy",
    "RegisterTransport",
    "RestoreOutlook",
    "Shape",
    "Size",
    "StagingArea",
    "ThreadTuningStrategy",
    "TierBackend",
    "TierMemoryError",
    "TierUsage",
    "Transfer",
    "TransportError",
    "UnsupportedError",
    "Window",
    "WriteTransfer",
    "build_descriptors",
    "check_device",
    "coalesce",
    "follow_coalescing",
    "fragment_offsets",
    "fragment_planes",
    "hookimpl",
    "host_part",
    "host_port",
    "key_part",
    "mismatch",
    "number_field",
    "packed",
    "size_field",
    "stages_pages",
    "staging_below_field",
    "staging_bytes_field",
    "staging_pages",
    "strategy_name",
    "tunable",
]
