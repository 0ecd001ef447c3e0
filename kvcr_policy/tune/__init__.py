"""``kvcr-policy tune``: measure this host and write the profile that is fastest on it.

- :mod:`.space`: the knobs, from the tunable declarations (:mod:`kvcr_policy.config.tunable`)
  of the schema and of the options models the starting config names, built-in or third-party;
- :mod:`.search`: optuna's TPE sampler over them within a time budget, each trial one
  comparison against the start through the bench's runner (:mod:`kvcr_policy.bench`);
- :mod:`.verdict`: no win without evidence (both orders, repeats, the screen, the spread);
- :mod:`.written`, :mod:`.host`: the profile written, with its evidence in a comment header;
- :mod:`.run`: ``tune`` and ``tune --remeasure`` as functions; :mod:`.command`: the command.

Nothing but the CLI (and the tests) imports this package, and the package imports nothing:
the command line reads the budget's bounds (:mod:`.setup`) without importing the bench.
"""
