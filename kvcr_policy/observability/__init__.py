"""What a process reports about itself: Prometheus metrics (``kvcr_policy_*``) and where they
are served. :mod:`.metrics` holds the families, :mod:`.meter` what a pipeline records."""
