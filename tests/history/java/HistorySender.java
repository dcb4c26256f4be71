// An idempotent Java producer for history runs: one record per send operation, each outcome
// printed as a JSON line on stdout for the Python recorder (tests/history/java_client.py).
//
// Arguments: bootstrap topic partitions seed value-base began-seconds
//   began-seconds: the history's origin on the monotonic clock (CLOCK_MONOTONIC, which both
//   Python's time.monotonic and System.nanoTime read on Linux).
// Values are value-base + n for the n-th send to a partition, unique beside the Python
// clients' (which start at 0). Stops when stdin closes.

import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

public final class HistorySender {
    private static final int SEND_TIMEOUT_MS = 30_000;

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        Random random = new Random(Long.parseLong(args[3]));
        long valueBase = Long.parseLong(args[4]);
        double began = Double.parseDouble(args[5]);
        AtomicBoolean stopping = new AtomicBoolean();
        Thread watcher = new Thread(() -> {
            try {
                while (System.in.read() >= 0) { }
            } catch (Exception ignored) { }
            stopping.set(true);
        });
        watcher.setDaemon(true);
        watcher.start();
        Map<Integer, Long> next = new HashMap<>();
        int client = 0;
        while (!stopping.get()) {
            KafkaProducer<String, String> producer = producer(bootstrap, client);
            try {
                while (!stopping.get()) {
                    int partition = random.nextInt(partitions);
                    long value = valueBase + next.merge(partition, 1L, Long::sum) - 1;
                    if (!send(producer, client, topic, partition, value, began)) {
                        break; // outcome unknown: a new client, as the history requires
                    }
                }
            } finally {
                producer.close(Duration.ofSeconds(5)); // not forever on a broken cluster
            }
            client++;
        }
    }

    private static KafkaProducer<String, String> producer(String bootstrap, int client) {
        Properties config = new Properties();
        config.put("bootstrap.servers", bootstrap);
        config.put("client.id", "java-sender-" + client);
        config.put("enable.idempotence", "true");
        config.put("acks", "all");
        config.put("linger.ms", "2");
        config.put("delivery.timeout.ms", Integer.toString(SEND_TIMEOUT_MS));
        config.put("request.timeout.ms", "10000");
        return new KafkaProducer<>(config, new StringSerializer(), new StringSerializer());
    }

    private static boolean send(
            KafkaProducer<String, String> producer,
            int client, String topic, int partition, long value, double began) {
        double invoked = now(began);
        String key = topic + "/" + partition;
        Future<RecordMetadata> sent = producer.send(
                new ProducerRecord<>(topic, partition, null, Long.toString(value)));
        try {
            RecordMetadata metadata = sent.get(SEND_TIMEOUT_MS + 5_000, TimeUnit.MILLISECONDS);
            print(client, invoked, now(began), "ok", key, value, metadata.offset(), null);
            return true;
        } catch (ExecutionException | TimeoutException e) {
            // An idempotent producer that gave up on a record cannot say whether it was written.
            Throwable cause = e instanceof ExecutionException ? e.getCause() : e;
            print(client, invoked, now(began), "info", key, value, -1, String.valueOf(cause));
            return false;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            print(client, invoked, now(began), "info", key, value, -1, "interrupted");
            return false;
        }
    }

    private static double now(double began) {
        return System.nanoTime() / 1e9 - began;
    }

    private static void print(
            int client, double invoked, double completed, String type,
            String key, long value, long offset, String error) {
        StringBuilder line = new StringBuilder();
        line.append("{\"client\":").append(client)
                .append(",\"invoked\":").append(invoked)
                .append(",\"completed\":").append(completed)
                .append(",\"type\":\"").append(type).append('"')
                .append(",\"key\":\"").append(key).append('"')
                .append(",\"value\":").append(value)
                .append(",\"offset\":").append(offset);
        if (error != null) {
            line.append(",\"error\":\"").append(escape(error)).append('"');
        }
        System.out.println(line.append('}'));
        System.out.flush();
    }

    private static String escape(String text) {
        StringBuilder out = new StringBuilder();
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.toString();
    }
}
