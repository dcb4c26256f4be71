"""Embedded backends: everything a single machine needs, with no server and no extra package."""
