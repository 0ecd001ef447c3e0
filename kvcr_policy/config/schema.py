"""PolicyConfig and its sections: data, defaults and constraints, no I/O.

Every default reproduces upstream behaviour (the DESIGN table): a config built from defaults
changes nothing. Section types may be constructed positionally; their field order is pinned in
``schemas/field-order.json`` (new fields are appended, never inserted).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..errors import UsageError
from ..values import Size
from .fields import number_field, size_field
from .rates import GBPerSecond
from .tunable import tunable

__all__ = [
    "ENV_PREFIX",
    "MAX_TIER_BYTES",
    "MIN_SECRET_CHARS",
    "POSITIONAL_TYPES",
    "TENANT_NAME",
    "TENANT_NAME_RULE",
    "VALIDATING_ORIGINS",
    "AdmissionSection",
    "BackendSection",
    "BatchingSection",
    "CoalescingSection",
    "EvictionSection",
    "FallbackSection",
    "ObservabilitySection",
    "PlacementSection",
    "PluginsSection",
    "PolicyConfig",
    "Section",
    "SecuritySection",
    "ThreadTuningSection",
    "TransportSection",
    "check_secret",
    "strategy_name",
]

ENV_PREFIX = "KVCR_POLICY_"
#: The origins of the values being validated: load_config sets them so that a cross-field
#: rule can say where each value came from (pydantic's validation context does not reach the
#: validators: Section's positional __init__ makes pydantic call __init__, which drops it).
VALIDATING_ORIGINS: ContextVar[Mapping[str, str]] = ContextVar(
    "kvcr_policy_validating_origins", default=MappingProxyType({})
)
#: Largest tier a pool may have (placement.capacity_bytes): 256 TiB.
MAX_TIER_BYTES = 1 << 48


class Section(BaseModel):
    """A frozen config type that forbids unknown keys and accepts positional arguments.

    Positional arguments bind to fields in declaration order, which the ordered-field contract
    pins; integrators that build config types positionally keep working across releases.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def __init__(self, /, *args: Any, **data: Any) -> None:
        if args:
            names = list(type(self).model_fields)
            if len(args) > len(names):
                message = (
                    f"{type(self).__name__} takes at most {len(names)} positional arguments "
                    f"({', '.join(names)}); got {len(args)}"
                )
                raise UsageError(message)
            for name, value in zip(names, args, strict=False):  # fewer args than fields is fine
                if name in data:
                    message = f"{type(self).__name__} got {name!r} both by position and by name"
                    raise UsageError(message)
                data[name] = value
        super().__init__(**data)


def _options_field() -> Any:
    return Field(
        default_factory=dict,
        description="Options of the chosen strategy, validated by that strategy's own model.",
    )


class BatchingSection(Section):
    """How reads and metadata queries are grouped, and how much may be in flight at once."""

    strategy: str = Field("fixed", description="Name of the registered batching strategy.")
    read_batch_pages: int = number_field(
        128,
        0,
        65536,
        "Pages per read or write batch (1..65536).",
        above=True,
        tuned=tunable(choices=(32, 64, 128, 256, 512, 1024, 2048)),
    )
    query_batch_keys: int = number_field(
        128, 0, 1 << 20, "Keys per metadata-query batch (1..1048576).", above=True
    )
    window_batches: int | None = number_field(
        None,
        0,
        65536,
        "Most batches in flight at once (1..65536); unset means unbounded.",
        above=True,
        tuned=tunable(choices=(None, 1, 2, 4, 8, 16)),
    )
    window_pages: int | None = number_field(
        None,
        0,
        1 << 24,
        "Most pages in flight at once (1..16777216); unset means unbounded.",
        above=True,
    )
    window_bytes: Size | None = size_field(
        None,
        1 << 50,
        "Most bytes in flight at once (e.g. '1GiB', at most 1PiB); unset means unbounded.",
    )
    options: dict[str, Any] = _options_field()
    first_batch_pages: int | None = number_field(
        None,
        0,
        65536,
        "Pages in the first read or write batch of a call (1..65536; above "
        "read_batch_pages counts as read_batch_pages), each next batch twice the last up to "
        "read_batch_pages, so the first copy starts before a whole batch is planned; unset "
        "means every batch is read_batch_pages.",
        above=True,
    )

    read_batch_bytes: Size | None = size_field(
        None,
        1 << 50,
        "The least bytes a read or write batch holds (e.g. '256MiB'): consecutive batches of "
        "the strategy are joined until they hold that much, so pages smaller than "
        "read_batch_bytes / read_batch_pages go in batches of more pages (each batch costs "
        "planning and issuing whatever its size); the last batch of a call may hold less. "
        "Unset: the strategy's batches as they are.",
    )

    @model_validator(mode="after")
    def _window_holds_a_batch(self) -> BatchingSection:
        if self.window_pages is not None and self.window_pages < self.read_batch_pages:
            message = (
                f"batching.window_pages ({self.window_pages}) must be at least "
                f"batching.read_batch_pages ({self.read_batch_pages}), or no batch could ever "
                "start; raise window_pages or lower read_batch_pages"
            )
            raise ValueError(message)
        return self


class CoalescingSection(Section):
    """Whether transfer descriptors are merged and cut before they reach the transport."""

    strategy: str = Field(
        "none", description="Name of the coalescing strategy: 'none' sends one per fragment."
    )
    split_bytes: Size | None = size_field(
        None,
        1 << 40,
        "Cut descriptors longer than this (e.g. UCX '8MiB', at most 1TiB); unset: never.",
        tuned=tunable(choices=(None, "4MiB", "16MiB", "64MiB", "256MiB")),
    )
    on_unsupported: Literal["fallback", "error"] = Field(
        "fallback",
        description="When the transport cannot coalesce or split: send plain descriptors, or fail.",
    )
    options: dict[str, Any] = _options_field()


class PlacementSection(Section):
    """Backing, huge pages, NUMA and slot allocation of the process-owned DRAM tier."""

    strategy: str = Field("anonymous", description="Name of the placement strategy.")
    capacity_bytes: Size = size_field(
        4 << 30, MAX_TIER_BYTES, "DRAM tier size reserved per pool (e.g. '64GiB', at most 256TiB)."
    )
    prefault: bool = Field(False, description="Touch the whole tier when it opens.")
    huge_pages: Literal["off", "prefer", "require"] = Field(
        "off",
        description="Transparent huge-page advice for the tier (MADV_HUGEPAGE).",
        # 'require' is a deployment's demand, not a speed: it only adds a way to fail.
        json_schema_extra=tunable(choices=("off", "prefer")),
    )
    numa_policy: Literal["none", "preferred", "bind", "interleave", "gpu"] = Field(
        "none",
        description=(
            "NUMA memory policy applied to the tier with mbind(2); 'gpu': the node of each "
            "pool's GPU (from sysfs), preferred or bound as numa_mode says, and left unbound "
            "where the GPU reports no node."
        ),
    )
    numa_nodes: tuple[Annotated[int, Field(ge=0, le=1023)], ...] = Field(
        (), max_length=1024, description="NUMA nodes named by numa_policy (each 0..1023)."
    )
    numa_mode: Literal["prefer", "require"] = Field(
        "prefer",
        description=(
            "On a NUMA placement that cannot be had: warn and go on, or fail ('gpu': prefer "
            "the GPU's node, or bind to it)."
        ),
    )
    eviction: Literal["lru", "fifo"] = Field(
        "lru",
        description="Eviction policy of the slot store: 'lru' or 'fifo'. The older spelling "
        "of eviction.strategy, used when that is unset; setting both to different names is "
        "an error.",
    )
    options: dict[str, Any] = _options_field()

    @model_validator(mode="after")
    def _nodes_match_policy(self) -> PlacementSection:
        policy, nodes = self.numa_policy, list(self.numa_nodes)
        refusals = (
            (
                policy == "gpu" and nodes,
                f"placement.numa_nodes {nodes} is set but placement.numa_policy 'gpu' takes "
                "each tier's node from its pool's GPU; drop numa_nodes, or name the nodes with "
                "numa_policy 'preferred', 'bind' or 'interleave'",
            ),
            (
                policy == "none" and nodes,
                f"placement.numa_nodes {nodes} is set but placement.numa_policy is 'none'; set "
                "numa_policy to 'preferred', 'bind' or 'interleave', or drop numa_nodes",
            ),
            (
                policy not in ("none", "gpu") and not nodes,
                f"placement.numa_policy {policy!r} needs placement.numa_nodes; name at least "
                "one node, e.g. numa_nodes = [0]",
            ),
            (
                policy == "preferred" and len(nodes) != 1,
                "placement.numa_policy 'preferred' takes exactly one node in "
                f"placement.numa_nodes; got {nodes}",
            ),
        )
        for refused, message in refusals:
            if refused:
                raise ValueError(message)
        return self


class ThreadTuningSection(Section):
    """Python thread-switch tuning while a pipeline is open."""

    strategy: str = Field("switch_interval", description="Name of the thread tuning strategy.")
    switch_interval_s: float | None = number_field(
        None,
        1e-6,
        1.0,
        "sys.setswitchinterval value while open (e.g. 0.0005; 1e-6..1.0, Python "
        "stores less than a microsecond as 0); unset: untouched.",
        tuned=tunable(choices=(None, 0.0001, 0.0005, 0.001, 0.005)),
    )
    options: dict[str, Any] = _options_field()


class FallbackSection(Section):
    """What a failed or unsupported transfer becomes."""

    strategy: str = Field(
        "sparse", description="Name of the fallback strategy: 'sparse' retries page by page."
    )
    max_retries: int = number_field(
        1, 0, 100, "Per-page retries of a failed batch before the page is a miss (0..100)."
    )
    options: dict[str, Any] = _options_field()


class TransportSection(Section):
    """Which transport moves the bytes, and its common knobs."""

    name: str = Field("cpu", description="Registered transport: 'cpu', 'cuda', 'ucx', 'memory'.")
    threads: int = number_field(
        1,
        0,
        1024,
        "Copy threads of the cpu transport (0..1024); 0 means one per CPU core.",
        tuned=tunable(
            choices=(1, 2, 4, 8, 16, 32, 64), at_most_cpus=True, when={"transport.name": ["cpu"]}
        ),
    )
    op_timeout_s: float = number_field(
        30.0,
        0.001,
        86400,
        "Longest a single transfer may take before it counts as failed (0.001..86400 s).",
    )
    options: dict[str, Any] = _options_field()
    stream_min_bytes: Size | None = size_field(
        None,
        1 << 40,
        "cpu transport: copies of at least this size use non-temporal stores (e.g. '1MiB', "
        "at most 1TiB); unset: plain memmove.",
        tuned=tunable(
            choices=(None, "16KiB", "256KiB", "1MiB", "4MiB", "16MiB"),
            when={"transport.name": ["cpu"]},
        ),
    )


class PluginsSection(Section):
    """Which plugins load, and what happens when one is broken."""

    strict: bool = Field(False, description="A plugin that fails to load is an error, not skipped.")
    allow: tuple[str, ...] | None = Field(
        None, description="Only these plugins load (env KVCR_POLICY_PLUGINS, comma-separated)."
    )
    block: tuple[str, ...] = Field(
        (), description="These plugins never load (env KVCR_POLICY_DISABLE_PLUGINS)."
    )


class BackendSection(Section):
    """Where pages live: the tier backend, chosen by name, and its own options."""

    name: str = Field(
        "auto",
        description=(
            "Registered tier backend: 'dram' (a process-owned region per pool), 'peer' (a "
            "`kvcr-policy serve` tier over UCX) or a plugin's; 'auto' takes the one the "
            "transport belongs to ('peer' for 'ucx', else 'dram')."
        ),
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the chosen backend, validated by that backend's own model.",
    )


class ObservabilitySection(Section):
    """What this process reports about itself: Prometheus metrics and the link limit."""

    metrics: bool = Field(
        True,
        description=(
            "Record kvcr_policy_* metrics in prometheus-client's default registry (per call or "
            "per batch, never per page); inside SGLang with --enable-metrics they appear in "
            "SGLang's /metrics. false: record nothing."
        ),
    )
    audit_placement: bool = Field(
        False,
        description=(
            "Audit each pool's tier placement when the pool registers (huge-page bytes, pages "
            "per NUMA node) and export it; Pipeline.audit() always refreshes the gauges."
        ),
    )
    link_probe_bytes: Size | None = size_field(
        None,
        1 << 40,
        "Measure the link limit when a pool registers: one move of this many bytes from "
        "the tier into the pool's first bytes, before the engine uses the pool (e.g. "
        "'256MiB', at most 1TiB); unset: not measured.",
    )
    link_limit_gbps: GBPerSecond = Field(
        None,
        ge=0.001,
        le=100000,
        allow_inf_nan=False,
        description=(
            "A known link limit with its unit (e.g. '50GB/s', '400Gbit/s', '46.6GiB/s'; "
            "1MB/s..100TB/s), exported when none is measured and used by `kvcr-policy plan`; "
            "unset: none."
        ),
    )
    metrics_public: bool = Field(
        False,
        description=(
            "`serve --metrics` and `bench --metrics` may listen on an address other than "
            "loopback, where anyone who reaches it reads the counters; false: such an address "
            "is refused."
        ),
    )
    tenant_labels: bool = Field(
        False,
        description=(
            "`serve` with tenants: tier metrics name each tenant (pool label 'TENANT/POOL'); "
            "false: an opaque id stands for the tenant ('tenant-<8 hex>/POOL')."
        ),
    )
    native_logs: bool = Field(
        False,
        description=(
            "Mooncake's and NIXL's own log lines (INFO and WARNING) on stderr. false: errors "
            "only (MC_LOG_LEVEL and NIXL_LOG_LEVEL ERROR, unless the environment sets them), "
            "decided where the library first loads in the process."
        ),
    )


class EvictionSection(Section):
    """Which published page a full tier gives up first: the eviction strategy, by name."""

    strategy: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description=(
            "Name of the registered eviction strategy: 'lru' (upstream), 'fifo' or a plugin's. "
            "Unset: placement.eviction, the older spelling (both set to different names is an "
            "error)."
        ),
    )
    options: dict[str, Any] = _options_field()


class AdmissionSection(Section):
    """How many leading present pages a lookup reports as hits: the admission strategy."""

    strategy: str = Field(
        "none",
        min_length=1,
        max_length=200,
        description=(
            "Name of the registered admission strategy: 'none' (upstream: every present page "
            "is a hit), 'gate' (only a prefix that restores sooner than the engine computes "
            "it) or a plugin's."
        ),
    )
    options: dict[str, Any] = _options_field()


#: Fewest characters a peer secret may have (a generated one has 43).
MIN_SECRET_CHARS = 16
#: A tenant's name: the name of its file in security.tenants_dir.
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)
TENANT_NAME_RULE = "1..64 of A-Z a-z 0-9 . _ - (starting with a letter or digit)"


class SecuritySection(Section):
    """Who may use a peer tier (``kvcr-policy serve``): the secret, tenants and their limits.

    ``secret`` is read only from the environment, a ``.env`` file or a secrets directory, never
    from a profile or the command line (loading refuses it there), and never printed.
    """

    secret: SecretStr | None = Field(
        None,
        description="This process's peer secret (16..4096 characters). Only from env "
        "KVCR_POLICY_SECURITY__SECRET, a .env file or a file kvcr_policy_security__secret in "
        "KVCR_POLICY_SECRETS_DIR; never from a profile or the command line.",
    )
    secret_file: Path | None = Field(
        None,
        description="A file that holds the peer secret, readable only by its owner; unset: "
        "$XDG_CONFIG_HOME/kvcr-policy/peer.secret (~/.config/...), which `serve` creates "
        "when no secret is configured.",
    )
    tenants_dir: Path | None = Field(
        None,
        description="`serve`: a directory readable only by its owner with one file per tenant, "
        "named for the tenant and holding its secret; unset: one tenant, 'default', whose "
        "secret is this process's.",
    )
    insecure: bool = Field(
        False,
        description="No authentication: `serve` accepts any client (loopback only, one shared "
        "tenant) and a client accepts such a peer. `serve --insecure` sets it.",
    )
    admin_tenants: tuple[str, ...] = Field(
        (),
        max_length=1024,
        description="`serve`: tenants whose STATS also count every tenant's tiers and sessions "
        "(never their keys or pages).",
    )
    tenant_quota_bytes: Size | None = size_field(
        None,
        1 << 50,
        "`serve`: most bytes one tenant's tiers may cost, pages and bookkeeping (3 KiB "
        "a slot) together (at most 1PiB); unset: transport.options.max_tiers tiers of "
        "placement.capacity_bytes.",
    )
    tenant_max_sessions: int = number_field(
        64, 1, 1024, "`serve`: most connections one tenant may hold (1..1024)."
    )
    handshake_timeout_s: float = number_field(
        5.0,
        0.05,
        300,
        "`serve`: a connection must authenticate within this (0.05..300 s); until "
        "then its frames are small (at most 64 KiB).",
    )
    idle_timeout_s: float = number_field(
        60.0,
        0.1,
        86400,
        "`serve`: a session that sends nothing for this long is closed "
        "(0.1..86400 s); clients ping every transport.options.heartbeat_s while idle.",
    )
    tenant_rate: GBPerSecond = Field(
        None,
        ge=1e-6,
        le=1e5,
        allow_inf_nan=False,
        description="`serve`: most bytes per second one tenant's reads and writes may move "
        "together, with a unit (e.g. '50MB/s', '10Gbit/s'; 1kB/s..100TB/s): a token bucket "
        "per tenant holding 0.1 s of it; a request past it is answered once paid for. Unset: "
        "no limit. `serve --tenant-rate` sets it.",
    )

    @field_validator("admin_tenants")
    @classmethod
    def _tenant_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [name for name in value if not TENANT_NAME.fullmatch(name)]
        if bad:
            names = ", ".join(repr(name) for name in bad[:3])
            raise ValueError(
                f"{names}: no tenant can have this name; a tenant name is {TENANT_NAME_RULE}"
            )
        return value

    @field_validator("secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_secret(value.get_secret_value())
        return value


def check_secret(text: str) -> str:
    """A peer secret's text, refused (ValueError, the secret not echoed) unless 16..4096
    characters with no surrounding whitespace."""
    if not MIN_SECRET_CHARS <= len(text) <= 4096 or text != text.strip():
        message = (
            f"a peer secret has {MIN_SECRET_CHARS} to 4096 characters and no surrounding "
            f"whitespace (this one has {len(text)}); make one with "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )
        raise ValueError(message)
    return text


class PolicyConfig(Section):
    """The whole validated configuration. Frozen: plugins read it, never change it."""

    batching: BatchingSection = Field(default_factory=BatchingSection)
    coalescing: CoalescingSection = Field(default_factory=CoalescingSection)
    placement: PlacementSection = Field(default_factory=PlacementSection)
    thread_tuning: ThreadTuningSection = Field(default_factory=ThreadTuningSection)
    fallback: FallbackSection = Field(default_factory=FallbackSection)
    transport: TransportSection = Field(default_factory=TransportSection)
    plugins: PluginsSection = Field(default_factory=PluginsSection)
    backend: BackendSection = Field(default_factory=BackendSection)
    observability: ObservabilitySection = Field(default_factory=ObservabilitySection)
    security: SecuritySection = Field(default_factory=SecuritySection)
    eviction: EvictionSection = Field(default_factory=EvictionSection)
    admission: AdmissionSection = Field(default_factory=AdmissionSection)

    @field_validator("eviction")
    @classmethod
    def _one_eviction_name(cls, value: EvictionSection, info: ValidationInfo) -> EvictionSection:
        # placement is validated before eviction (declared first), so it is in info.data.
        placement = info.data.get("placement")
        if value.strategy is None or not isinstance(placement, PlacementSection):
            return value
        if "eviction" in placement.model_fields_set and placement.eviction != value.strategy:
            origins = VALIDATING_ORIGINS.get()

            def where(path: str) -> str:
                return f" (from {origins[path]})" if path in origins else ""

            message = (
                f"eviction.strategy {value.strategy!r}{where('eviction.strategy')} and "
                f"placement.eviction {placement.eviction!r}{where('placement.eviction')} name "
                "different eviction strategies; eviction.strategy replaces placement.eviction: "
                "drop placement.eviction, or give both the same name"
            )
            raise ValueError(message)
        return value


def strategy_name(config: PolicyConfig, section: str) -> str:
    """The strategy a section selects: its ``strategy``; for ``eviction`` unset, the older
    ``placement.eviction``."""
    if section == "eviction":
        return config.eviction.strategy or config.placement.eviction
    return str(getattr(config, section).strategy)


#: Every public config type whose positional order is pinned in schemas/field-order.json.
POSITIONAL_TYPES: tuple[type[Section], ...] = (
    PolicyConfig,
    BatchingSection,
    CoalescingSection,
    PlacementSection,
    ThreadTuningSection,
    FallbackSection,
    TransportSection,
    PluginsSection,
    BackendSection,
    ObservabilitySection,
    SecuritySection,
    EvictionSection,
    AdmissionSection,
)

#: Strategy sections and the registry kind that names their strategy.
STRATEGY_SECTIONS: dict[str, str] = {
    "batching": "batching",
    "coalescing": "coalescing",
    "placement": "placement",
    "thread_tuning": "thread_tuning",
    "fallback": "fallback",
    "eviction": "eviction",
    "admission": "admission",
}
