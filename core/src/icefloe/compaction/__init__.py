"""Compaction: WAL chunks into Parquet files, at once topic tables and catch-up reads."""
