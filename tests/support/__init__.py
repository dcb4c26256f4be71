"""Shared helpers for Icefloe's own test suite (not shipped)."""
