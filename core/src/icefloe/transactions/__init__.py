"""Kafka transactions: the coordinator and the state it keeps per transactional id."""
