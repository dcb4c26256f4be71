"""Icefloe and Apache Kafka 4.1.1 side by side, with the same clients and workloads.

    python -m tests.bench.sidebyside [--rounds 3] [--profiles cost,latency] [--brokers 1]
                                     [--records 1000000] [--rate 5000] [--rate-seconds 10]
                                     [--confluent-records 500000] [--no-parquet]
                                     [--store local|minio] [--producer-prop KEY=VALUE ...]
                                     [--icefloe-producer-prop KEY=VALUE ...]
                                     [--json PATH] [--quick] [--report PATH]

Kafka comes from Maven Central (``kafka-pom.xml``, cached in ``.servers/kafka-4.1.1/lib``) and
runs as one KRaft node (broker and controller) on 127.0.0.1, with Kafka's defaults; Icefloe runs
as `icefloe serve` on the embedded default, once per chosen flush profile (on the local store the
default profile is latency). Each round starts every system afresh in a
temporary folder, Kafka first, and runs on an 8-partition topic, 1 KiB records, acks=all:

- ``java_producer``: Kafka's ProducerPerformance, the Java client's defaults plus linger.ms=5
  and batch.size=65536, as fast as it goes;
- ``java_throttled``: the same at ``--rate`` records/s, for latency;
- ``confluent_producer``: a confluent-kafka (librdkafka) producer, linger.ms=5, as fast as it
  goes (:mod:`.confluent_producer`);
- ``java_consumer``: Kafka's ConsumerPerformance, a new group reading the topic from the start;
- Icefloe only: restarted so that its compactor turns the whole log into Parquet at once,
  ``compaction`` (until `icefloe tables` shows no lag) and ``parquet_consumer`` (the consumer
  again, now reading Parquet).

``--store minio`` puts Icefloe's object store (and so its WAL, cost profile by default) on S3
served by a MinIO started on 127.0.0.1 (``scripts/install-servers`` builds it), a fresh prefix
per round; ``--producer-prop`` changes the Java producer's settings for both systems, to find
the client settings that suit a store, and ``--icefloe-producer-prop`` for Icefloe alone, to
compare such settings with Kafka under its defaults.

Each workload also records the server's CPU seconds (user + system, of Kafka's JVM or of
Icefloe's broker processes and their compaction workers) and its peak RSS (VmHWM) so far. The
table gives medians over the rounds and the Icefloe/Kafka ratio of each; the JSON keeps every
number. Not a pytest test: nothing here is named ``test_*``.
"""
