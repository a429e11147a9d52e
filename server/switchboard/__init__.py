"""Switchboard: PostgreSQL as the only coordination layer for N stateless replicas."""

__version__ = "0.2.0"
