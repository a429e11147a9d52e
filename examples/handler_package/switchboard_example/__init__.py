"""Example task handlers for Switchboard (see handlers.py)."""
