"""Icefloe's WAL on Apache BookKeeper ledgers (``[wal] backend = "bookkeeper"``)."""
