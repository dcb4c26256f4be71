"""Icefloe topic tables in Delta Lake (backend ``delta``), on delta-rs."""
