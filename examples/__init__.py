"""Runnable examples: ``brokerkit run examples.email_worker:app``."""
