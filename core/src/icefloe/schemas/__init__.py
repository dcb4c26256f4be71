"""Schema-backed topics: the schema registry Icefloe serves, and the typed table columns
compaction decodes from records in the Confluent wire format."""
