"""``kvcr-policy plan``: sizing and restore figures for a deployment, before it exists.

This package imports nothing: the command line reads the bounds of :mod:`.trace` without
importing the figures. Import the module you need.

For a token count: :func:`.request.build_request` gathers the inputs with their origins,
:func:`.figures.make_plan` works out the figures with the objects a pipeline would use,
:func:`.report.plan_table` shows them. For a request trace (``--trace``), one module each:

- :mod:`.trace`: Mooncake's trace format, read and checked line by line;
- :mod:`.replay`: the replay model (the definition of a hit, followed exactly);
- :mod:`.replay_bytes`: the same requests through a real pipeline, checked against the model;
- :mod:`.workload`: the figures per eviction strategy and capacity;
- :mod:`.workload_report` and :mod:`.curve`: the tables and the hit-rate curve;
- :mod:`.command`: the command line behind both.
"""
