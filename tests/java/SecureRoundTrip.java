import java.io.FileReader;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/** Produces N records idempotently (in one transaction when TRANSACTIONAL_ID is given),
 *  then consumes them in a group with read_committed and commits, all with the security
 *  settings of a client properties file (SASL_SSL, SCRAM).
 *  Usage: SecureRoundTrip CLIENT_PROPERTIES TOPIC GROUP N [TRANSACTIONAL_ID].
 *  Prints {"consumed": [values]} or {"error": "ExceptionClass"}. */
public class SecureRoundTrip {
    public static void main(String[] args) throws Exception {
        Properties base = new Properties();
        try (FileReader reader = new FileReader(args[0])) {
            base.load(reader);
        }
        String topic = args[1], group = args[2];
        int count = Integer.parseInt(args[3]);
        Properties p = new Properties();
        p.putAll(base);
        p.put("enable.idempotence", "true");
        p.put("acks", "all");
        p.put("max.block.ms", "20000");
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        String transactionalId = args.length > 4 ? args[4] : null;
        if (transactionalId != null) {
            p.put("transactional.id", transactionalId);
        }
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            if (transactionalId != null) {
                producer.initTransactions();
                producer.beginTransaction();
            }
            for (int i = 0; i < count; i++) {
                producer.send(new ProducerRecord<>(topic, 0, "k" + i, "v" + i)).get();
            }
            if (transactionalId != null) {
                producer.commitTransaction();
            }
        } catch (Exception e) {
            printError(e);
            return;
        }
        Properties c = new Properties();
        c.putAll(base);
        c.put("group.id", group);
        c.put("auto.offset.reset", "earliest");
        c.put("enable.auto.commit", "false");
        c.put("isolation.level", "read_committed");
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        List<String> values = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            consumer.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 30_000;
            while (values.size() < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    values.add(r.value());
                }
            }
            consumer.commitSync();
        } catch (Exception e) {
            printError(e);
            return;
        }
        StringBuilder out = new StringBuilder("{\"consumed\": [");
        for (int i = 0; i < values.size(); i++) {
            out.append(i == 0 ? "" : ", ").append('"').append(values.get(i)).append('"');
        }
        System.out.println(out.append("]}"));
    }

    private static void printError(Exception e) {
        Throwable cause = e.getCause() != null ? e.getCause() : e;
        System.out.println("{\"error\": \"" + cause.getClass().getSimpleName() + "\"}");
    }
}
