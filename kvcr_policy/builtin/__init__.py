"""Built-in strategies, each module a plugin registered like third-party ones (the built-in
backends register themselves: kvcr_policy.backends.dram.hooks, kvcr_policy.backends.peer.hooks)."""
