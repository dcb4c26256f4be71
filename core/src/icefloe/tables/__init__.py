"""Topics as tables: the row schema and where each table's files live."""
