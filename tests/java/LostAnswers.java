import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

/** An idempotent producer with five requests in flight that keeps sending numbered records
 *  (values "0", "1", ...) to partition 0 until a line (or end of input) arrives on stdin,
 *  then flushes. Lost answers stall its connection; it must time out, reconnect and retry.
 *  Usage: LostAnswers BOOTSTRAP TOPIC REQUEST_TIMEOUT_MS.
 *  Prints {"sent": n, "errors": e, "first_error": "...", "acked_in_order": true|false}. */
public class LostAnswers {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1];
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("enable.idempotence", "true");
        p.put("acks", "all");
        p.put("max.in.flight.requests.per.connection", "5");
        p.put("linger.ms", "2");
        p.put("batch.size", "512");
        p.put("request.timeout.ms", args[2]);
        p.put("delivery.timeout.ms", "120000");
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        AtomicBoolean stop = new AtomicBoolean();
        Thread watcher = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in))) {
                in.readLine();
            } catch (Exception ignored) {
                // end of input: stop as well
            }
            stop.set(true);
        });
        watcher.setDaemon(true);
        watcher.start();
        AtomicLong errors = new AtomicLong();
        AtomicLong lastOffset = new AtomicLong(-1);
        AtomicBoolean inOrder = new AtomicBoolean(true);
        String[] firstError = {""};
        int sent = 0;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            while (!stop.get()) {
                producer.send(new ProducerRecord<>(topic, 0, null, Integer.toString(sent)), (m, e) -> {
                    if (e != null) {
                        if (errors.getAndIncrement() == 0) {
                            firstError[0] = e.toString();
                        }
                    } else if (m.offset() <= lastOffset.getAndSet(m.offset())) {
                        inOrder.set(false);
                    }
                });
                sent++;
                if (sent % 5 == 0) {
                    Thread.sleep(2);
                }
            }
            producer.flush();
        }
        System.out.println("{\"sent\": " + sent + ", \"errors\": " + errors.get()
                + ", \"first_error\": \"" + firstError[0].replace("\"", "'")
                + "\", \"acked_in_order\": " + inOrder.get() + "}");
    }
}
