"""The Kafka-compatible broker: protocol server, API handlers, topics and cluster membership."""
