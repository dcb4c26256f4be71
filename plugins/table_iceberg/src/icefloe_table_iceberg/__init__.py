"""Icefloe topic tables in Apache Iceberg (backend ``iceberg``), on pyiceberg."""
