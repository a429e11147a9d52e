"""Switchboard: PostgreSQL as the only coordination layer for N stateless replicas."""

__version__ = "0.1.0"
