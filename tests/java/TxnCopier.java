import java.time.Duration;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The exactly-once copier with the Java client: consume, upper-case, produce, commit the
 * offsets in the transaction. Args: bootstrap input output group instance groupProtocol.
 * Runs until killed; prints one JSON line per committed transaction.
 */
public class TxnCopier {
    public static void main(String[] args) {
        String bootstrap = args[0], input = args[1], output = args[2], group = args[3];
        String instance = args[4], protocol = args[5];
        Properties c = new Properties();
        c.put("bootstrap.servers", bootstrap);
        c.put("group.id", group);
        c.put("group.protocol", protocol);
        c.put("enable.auto.commit", "false");
        c.put("isolation.level", "read_committed");
        // "none": the test commits offset 0 for every input partition before the copiers
        // start. kafka-clients 3.9.1 resets a partition to auto.offset.reset when its
        // OffsetFetch is answered STALE_MEMBER_EPOCH (as Kafka's broker answers during a
        // member epoch bump; fixed in later clients), which with "earliest" copies the
        // partition again from 0. With "none" the copier fails instead, and its supervisor
        // restarts it (docs/groups.md).
        c.put("auto.offset.reset", "none");
        c.put("key.deserializer", ByteArrayDeserializer.class.getName());
        c.put("value.deserializer", ByteArrayDeserializer.class.getName());
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("transactional.id", group + "-" + instance);
        p.put("transaction.timeout.ms", "10000");
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c);
             KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            consumer.subscribe(Collections.singletonList(input));
            while (true) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(500));
                if (records.isEmpty()) continue;
                ConsumerGroupMetadata membership = consumer.groupMetadata();
                Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                Map<TopicPartition, Long> first = new HashMap<>();
                producer.beginTransaction();
                try {
                    for (ConsumerRecord<byte[], byte[]> r : records) {
                        producer.send(new ProducerRecord<>(output, r.key(),
                            new String(r.value()).toUpperCase().getBytes()));
                        TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                        first.putIfAbsent(tp, r.offset());
                        next.put(tp, new OffsetAndMetadata(r.offset() + 1));
                    }
                    producer.sendOffsetsToTransaction(next, membership);
                    producer.commitTransaction();
                    System.out.println("{\"committed\": " + records.count() + ", \"epoch\": "
                        + membership.generationId() + "}");
                } catch (ProducerFencedException e) {
                    throw e;
                } catch (KafkaException e) {
                    producer.abortTransaction();
                    for (Map.Entry<TopicPartition, Long> f : first.entrySet()) {
                        if (consumer.assignment().contains(f.getKey())) consumer.seek(f.getKey(), f.getValue());
                    }
                    System.out.println("{\"aborted\": \"" + e.getClass().getSimpleName() + "\"}");
                }
            }
        }
    }
}
