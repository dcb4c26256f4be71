"""An in-memory object store: the smallest complete Icefloe plugin."""
