"""Configuration: a frozen, validated :class:`~.schema.PolicyConfig` and where each value came from.

This package imports nothing: many low modules import :mod:`.schema` alone, and a package face
that re-exported :func:`~.loading.load_config` would pull loading (and the plugin manager) into
each of them. Import the module you need:

- :mod:`.schema`: the sections, their fields and bounds (what a profile may say);
- :mod:`.loading`: :func:`~.loading.load_config` merges the sources in precedence order,
  validates once and returns a :class:`~.loading.LoadedConfig`;
- :mod:`.sources`: one module per input (profile, environment, ``.env``, overrides, secrets);
- :mod:`.provenance`: the origin each value carries (``profile ...``, ``env KVCR_POLICY_X``);
- :mod:`.profiles`: a profile's ``[profile]`` table (its base chain, what it was measured on);
- :mod:`.order`: the committed schemas and the pinned field order integrators rely on;
- :mod:`.table`: the ``kvcr-policy show`` table;
- :mod:`.tunable`: which fields ``tune`` searches, and their candidates;
- :mod:`.rates`, :mod:`.hosts`: link rates with their units, host names and addresses;
- :mod:`.user_files`, :mod:`.private_files`: reading a file a user named, and one that holds a
  secret;
- :mod:`.preflight`: whether one tier of the loaded configuration fits this host.
"""
