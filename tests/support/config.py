"""What a refused configuration load reports, as the user reads it."""

from __future__ import annotations

import pytest

from kvcr_policy.config.loading import load_config
from kvcr_policy.errors import ConfigError

__all__ = ["load_issues"]


def load_issues(**kwargs: object) -> list[str]:
    """Every problem ``load_config(**kwargs)`` reports, rendered (the load must fail)."""
    with pytest.raises(ConfigError) as caught:
        load_config(**kwargs)  # type: ignore[arg-type]
    return [issue.render() for issue in caught.value.issues]
