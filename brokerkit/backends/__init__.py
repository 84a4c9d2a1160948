"""Backends: the mechanism under the facade. See ``brokerkit.backends.base``."""
