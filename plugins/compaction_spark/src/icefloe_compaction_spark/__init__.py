"""Icefloe compaction engine on Apache Spark (backend ``spark``)."""
