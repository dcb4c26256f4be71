"""Topics: the cluster's registry of topics and their partitions' streams, and topic configs."""
