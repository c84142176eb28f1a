import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.TopicCollection;
import org.apache.kafka.common.Uuid;

/** describeTopics by name, then by the id that answered, then by an unknown id.
 *  Usage: DescribeTopicsById BOOTSTRAP TOPIC. Prints one JSON line per lookup. */
public class DescribeTopicsById {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        p.put("default.api.timeout.ms", "30000");
        try (Admin admin = Admin.create(p)) {
            TopicDescription byName = admin.describeTopics(
                TopicCollection.ofTopicNames(List.of(args[1]))).allTopicNames().get().get(args[1]);
            print("name", byName);
            Uuid id = byName.topicId();
            TopicDescription byId = admin.describeTopics(
                TopicCollection.ofTopicIds(List.of(id))).allTopicIds().get().get(id);
            print("id", byId);
            Uuid unknown = Uuid.randomUuid();
            try {
                admin.describeTopics(TopicCollection.ofTopicIds(List.of(unknown))).allTopicIds().get();
                System.out.println("{\"lookup\": \"unknown\", \"error\": null}");
            } catch (ExecutionException e) {
                System.out.println("{\"lookup\": \"unknown\", \"error\": \""
                    + e.getCause().getClass().getSimpleName() + "\"}");
            }
        }
    }

    static void print(String lookup, TopicDescription d) {
        System.out.println("{\"lookup\": \"" + lookup + "\", \"name\": \"" + d.name() + "\", \"id\": \""
            + d.topicId() + "\", \"partitions\": " + d.partitions().size() + "}");
    }
}
