"""Built-in strategies and transports, each module a plugin registered like third-party ones."""
