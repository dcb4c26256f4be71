"""Stream storage: WAL objects, the offset index, reads and idempotent producers."""
