import java.time.Duration;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * A consume-transform-produce loop with exactly-once semantics: reads IN (read_committed),
 * writes each value upper-cased to OUT, and commits the consumed offsets in the same
 * transaction, with the group metadata of the poll that returned the records (a member fenced
 * since cannot commit them). Prints "assigned N" when it gets partitions, "committed N T" after
 * its T-th transaction and "aborted T ERROR" when the group refuses its offsets (it then reads
 * the batch again); stops once idle.
 *
 * Usage: EosPipeline BOOTSTRAP TRANSACTIONAL_ID [PROTOCOL GROUP IN OUT IDLE_MS [STALL]]
 *
 * STALL is WHERE:N:MS, WHERE before-offsets or after-offsets: in its N-th transaction the
 * loop sleeps MS before sending (or after sending) its offsets, past max.poll.interval.ms, so
 * that the consumer leaves the group and another member takes its partitions over.
 */
public final class EosPipeline {
    public static void main(String[] args) {
        String bootstrap = args[0];
        String protocol = args.length > 2 ? args[2] : "classic";
        String group = args.length > 3 ? args[3] : "eos-pipeline";
        String input = args.length > 4 ? args[4] : "in";
        String output = args.length > 5 ? args[5] : "out";
        long idleMs = args.length > 6 ? Long.parseLong(args[6]) : 8000;
        String[] stall = args.length > 7 ? args[7].split(":") : null;
        Properties consumerProps = new Properties();
        consumerProps.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        consumerProps.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        consumerProps.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        consumerProps.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        consumerProps.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        consumerProps.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        consumerProps.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "20");
        if (protocol.equals("classic")) {
            // A restarted instance joins as soon as the killed one's session lapses.
            consumerProps.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
        }
        if (stall != null) {
            consumerProps.put(ConsumerConfig.MAX_POLL_INTERVAL_MS_CONFIG, "3000");
        }
        Properties producerProps = new Properties();
        producerProps.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        producerProps.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, args[1]);
        try (KafkaConsumer<String, String> consumer =
                        new KafkaConsumer<>(consumerProps, new StringDeserializer(), new StringDeserializer());
                KafkaProducer<String, String> producer =
                        new KafkaProducer<>(producerProps, new StringSerializer(), new StringSerializer())) {
            producer.initTransactions();
            consumer.subscribe(List.of(input), new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> partitions) {}

                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                    if (!partitions.isEmpty()) {
                        System.out.println("assigned " + partitions.size());
                        System.out.flush();
                    }
                }
            });
            long idleSince = System.currentTimeMillis();
            long committed = 0;
            int transactions = 0;
            // Idle for IDLE_MS once records came (or for 60 s if none ever did): the input is done.
            while (System.currentTimeMillis() - idleSince < (committed > 0 ? idleMs : 60000)) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(500));
                if (records.isEmpty()) {
                    continue;
                }
                ConsumerGroupMetadata groupMetadata = consumer.groupMetadata();
                idleSince = System.currentTimeMillis();
                transactions++;
                producer.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                Map<TopicPartition, Long> firsts = new HashMap<>();
                for (ConsumerRecord<String, String> record : records) {
                    producer.send(new ProducerRecord<>(output, record.key(), record.value().toUpperCase()));
                    TopicPartition partition = new TopicPartition(record.topic(), record.partition());
                    firsts.putIfAbsent(partition, record.offset());
                    offsets.put(partition, new OffsetAndMetadata(record.offset() + 1));
                }
                try {
                    stallIf(stall, "before-offsets", transactions);
                    producer.sendOffsetsToTransaction(offsets, groupMetadata);
                    stallIf(stall, "after-offsets", transactions);
                    producer.commitTransaction();
                } catch (ProducerFencedException fenced) {
                    throw fenced;
                } catch (KafkaException refused) {
                    // The group refused the offsets (this member was fenced): abort, and read the
                    // batch again from what this member still owns.
                    producer.abortTransaction();
                    System.out.println("aborted " + transactions + " " + refused.getClass().getSimpleName());
                    System.out.flush();
                    for (Map.Entry<TopicPartition, Long> first : firsts.entrySet()) {
                        if (consumer.assignment().contains(first.getKey())) {
                            consumer.seek(first.getKey(), first.getValue());
                        }
                    }
                    continue;
                }
                committed += records.count();
                System.out.println("committed " + committed + " " + transactions);
                System.out.flush();
            }
        }
    }

    private static void stallIf(String[] stall, String where, int transaction) {
        if (stall == null || !stall[0].equals(where) || Integer.parseInt(stall[1]) != transaction) {
            return;
        }
        System.out.println("stalled " + where + " " + transaction);
        System.out.flush();
        try {
            Thread.sleep(Long.parseLong(stall[2]));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        System.out.println("resumed " + transaction);
        System.out.flush();
    }
}
