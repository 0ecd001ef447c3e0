"""Reading /metrics in tests: over real HTTP, parsed by prometheus-client's own parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

#: (sample name, labels without ``profile`` as sorted pairs) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def read_samples(url: str, profile: str | None = None) -> Samples:
    """GET ``url`` and parse it with prometheus-client's parser; ``profile`` selects series."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if profile is not None and labels.pop("profile", None) != profile:
                continue
            samples[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels`` (0 if none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))
