import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/** Assigns every partition of a topic (no group), reads from the beginning until it has
 *  EXPECTED records, then keeps polling for POLLS more polls of at most 200 ms.
 *  Usage: AssignAll BOOTSTRAP TOPIC EXPECTED POLLS. Prints {"partitions": n, "records": n}. */
public class AssignAll {
    public static void main(String[] args) throws Exception {
        String topic = args[1];
        int expected = Integer.parseInt(args[2]), polls = Integer.parseInt(args[3]);
        Properties c = new Properties();
        c.put("bootstrap.servers", args[0]);
        c.put("fetch.max.wait.ms", "100");
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        int records = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            List<TopicPartition> partitions = new ArrayList<>();
            for (PartitionInfo p : consumer.partitionsFor(topic, Duration.ofSeconds(30)))
                partitions.add(new TopicPartition(topic, p.partition()));
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            long deadline = System.currentTimeMillis() + 60_000;
            while (records < expected && System.currentTimeMillis() < deadline)
                records += consumer.poll(Duration.ofMillis(200)).count();
            for (int i = 0; i < polls; i++)
                records += consumer.poll(Duration.ofMillis(200)).count();
            System.out.println("{\"partitions\": " + partitions.size() + ", \"records\": " + records + "}");
        }
    }
}
