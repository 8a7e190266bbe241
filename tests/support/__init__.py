"""Test support: real servers (see servers.py)."""
