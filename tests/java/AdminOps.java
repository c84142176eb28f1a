import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ClientMetricsResourceListing;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.ReplicaInfo;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;

/** Runs the Java Admin calls of issue 15 against one topic (one partition) and prints one
 *  JSON line per call: {"call": NAME, ...what it returned} or {"call": NAME, "error": CLASS}.
 *  Usage: AdminOps BOOTSTRAP TOPIC. */
public class AdminOps {
    static String q(Object s) {
        if (s == null) return "null";
        return "\"" + s.toString().replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    static void emit(String call, String fields) {
        System.out.println("{\"call\": " + q(call) + (fields.isEmpty() ? "" : ", " + fields) + "}");
    }

    static String error(Throwable t) {
        Throwable cause = t instanceof ExecutionException && t.getCause() != null ? t.getCause() : t;
        return "\"error\": " + q(cause.getClass().getSimpleName()) + ", \"message\": " + q(cause.getMessage());
    }

    interface Step { String run() throws Exception; }

    static void step(String call, Step s) {
        try {
            emit(call, s.run());
        } catch (Exception e) {
            emit(call, error(e));
        }
    }

    static String entry(ConfigEntry e) {
        return "{\"name\": " + q(e.name()) + ", \"value\": " + q(e.value()) + ", \"source\": "
            + q(e.source()) + ", \"type\": " + q(e.type()) + ", \"read_only\": " + e.isReadOnly()
            + ", \"synonyms\": " + e.synonyms().size() + "}";
    }

    static String describe(Admin admin, ConfigResource r, String... names) throws Exception {
        Config config = admin.describeConfigs(List.of(r), new DescribeConfigsOptions().includeSynonyms(true))
            .all().get(30, TimeUnit.SECONDS).get(r);
        List<String> out = new ArrayList<>();
        for (String n : names) {
            ConfigEntry e = config.get(n);
            out.add(q(n) + ": " + (e == null ? "null" : entry(e)));
        }
        return "\"configs\": {" + String.join(", ", out) + "}";
    }

    @SuppressWarnings("deprecation")
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1];
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("default.api.timeout.ms", "30000");
        ConfigResource topicResource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        ConfigResource brokerResource = new ConfigResource(ConfigResource.Type.BROKER, "0");
        TopicPartition tp = new TopicPartition(topic, 0);
        try (Admin admin = Admin.create(p)) {
            step("describeConfigs", () -> describe(admin, topicResource, "retention.ms", "cleanup.policy")
                + ", \"broker\": {" + describe(admin, brokerResource, "log.cleaner.enable").substring(12));
            step("incrementalAlterConfigs", () -> {
                admin.incrementalAlterConfigs(Map.of(topicResource, List.of(new AlterConfigOp(
                    new ConfigEntry("retention.ms", "3600000"), AlterConfigOp.OpType.SET))))
                    .all().get(30, TimeUnit.SECONDS);
                return describe(admin, topicResource, "retention.ms");
            });
            step("alterConfigs", () -> {
                admin.alterConfigs(Map.of(topicResource, new Config(List.of(
                    new ConfigEntry("segment.ms", "7200000"))))).all().get(30, TimeUnit.SECONDS);
                return describe(admin, topicResource, "segment.ms", "retention.ms");
            });
            step("alterConfigsInvalid", () -> {
                admin.incrementalAlterConfigs(Map.of(topicResource, List.of(new AlterConfigOp(
                    new ConfigEntry("retention.ms", "soon"), AlterConfigOp.OpType.SET))))
                    .all().get(30, TimeUnit.SECONDS);
                return "\"applied\": true";
            });
            step("describeTopics", () -> {
                TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames()
                    .get(30, TimeUnit.SECONDS).get(topic);
                return "\"partitions\": " + d.partitions().size() + ", \"leader\": "
                    + d.partitions().get(0).leader().id();
            });
            step("describeLogDirs", () -> {
                Map<Integer, Map<String, LogDirDescription>> dirs =
                    admin.describeLogDirs(List.of(0)).allDescriptions().get(30, TimeUnit.SECONDS);
                LogDirDescription d = dirs.get(0).values().iterator().next();
                ReplicaInfo info = d.replicaInfos().get(tp);
                return "\"dirs\": " + dirs.get(0).size() + ", \"size\": " + (info == null ? -1 : info.size())
                    + ", \"total\": " + d.totalBytes().orElse(-1L) + ", \"usable\": " + d.usableBytes().orElse(-1L);
            });
            step("electLeaders", () -> {
                Map<TopicPartition, Optional<Throwable>> r = admin.electLeaders(ElectionType.PREFERRED,
                    Set.of(tp)).partitions().get(30, TimeUnit.SECONDS);
                return "\"result\": " + q(r.get(tp).map(t -> t.getClass().getSimpleName()).orElse("none"));
            });
            step("alterPartitionReassignments", () -> {
                admin.alterPartitionReassignments(Map.of(tp, Optional.of(
                    new NewPartitionReassignment(List.of(0))))).all().get(30, TimeUnit.SECONDS);
                return "";
            });
            step("alterPartitionReassignmentsUnknownNode", () -> {
                admin.alterPartitionReassignments(Map.of(tp, Optional.of(
                    new NewPartitionReassignment(List.of(42))))).all().get(30, TimeUnit.SECONDS);
                return "\"applied\": true";
            });
            step("listPartitionReassignments", () -> "\"ongoing\": "
                + admin.listPartitionReassignments().reassignments().get(30, TimeUnit.SECONDS).size());
            // Dynamic broker configs (issue 15): the cluster default ("") and node 0's own
            // value of a key nothing else here depends on, removed again at the end.
            ConfigResource clusterDefault = new ConfigResource(ConfigResource.Type.BROKER, "");
            String key = "producer.id.expiration.ms";
            step("incrementalAlterConfigsBroker", () -> {
                admin.incrementalAlterConfigs(Map.of(
                    clusterDefault, List.of(new AlterConfigOp(new ConfigEntry(key, "90000000"),
                        AlterConfigOp.OpType.SET)))).all().get(30, TimeUnit.SECONDS);
                String afterDefault = describe(admin, brokerResource, key).substring(12);
                admin.incrementalAlterConfigs(Map.of(
                    brokerResource, List.of(new AlterConfigOp(new ConfigEntry(key, "90000001"),
                        AlterConfigOp.OpType.SET)))).all().get(30, TimeUnit.SECONDS);
                String afterNode = describe(admin, brokerResource, key).substring(12);
                String defaults = describe(admin, clusterDefault, key).substring(12);
                admin.incrementalAlterConfigs(Map.of(
                    clusterDefault, List.<AlterConfigOp>of(new AlterConfigOp(new ConfigEntry(key, null),
                        AlterConfigOp.OpType.DELETE)),
                    brokerResource, List.<AlterConfigOp>of(new AlterConfigOp(new ConfigEntry(key, null),
                        AlterConfigOp.OpType.DELETE)))).all().get(30, TimeUnit.SECONDS);
                return "\"after_default\": {" + afterDefault + ", \"after_node\": {" + afterNode
                    + ", \"default_resource\": {" + defaults + ", \"removed\": {"
                    + describe(admin, brokerResource, key).substring(12);
            });
            step("incrementalAlterConfigsBrokerRefused", () -> {
                admin.incrementalAlterConfigs(Map.of(brokerResource, List.of(new AlterConfigOp(
                    new ConfigEntry("num.partitions", "3"), AlterConfigOp.OpType.SET))))
                    .all().get(30, TimeUnit.SECONDS);
                return "\"applied\": true";
            });
            // CLIENT_METRICS (KIP-714): stored, listed (ListConfigResources v0), deleted.
            ConfigResource subscription = new ConfigResource(ConfigResource.Type.CLIENT_METRICS, topic);
            step("clientMetrics", () -> {
                admin.incrementalAlterConfigs(Map.of(subscription, List.of(new AlterConfigOp(
                    new ConfigEntry("interval.ms", "1000"), AlterConfigOp.OpType.SET))))
                    .all().get(30, TimeUnit.SECONDS);
                List<String> names = new ArrayList<>();
                for (ClientMetricsResourceListing l : admin.listClientMetricsResources().all()
                        .get(30, TimeUnit.SECONDS))
                    names.add(l.name());
                String described = describe(admin, subscription, "interval.ms");
                admin.incrementalAlterConfigs(Map.of(subscription, List.<AlterConfigOp>of(new AlterConfigOp(
                    new ConfigEntry("interval.ms", null), AlterConfigOp.OpType.DELETE))))
                    .all().get(30, TimeUnit.SECONDS);
                return "\"listed\": " + names.contains(topic) + ", " + described;
            });
            step("describeFeatures", () -> "\"finalized\": " + q(admin.describeFeatures()
                .featureMetadata().get(30, TimeUnit.SECONDS).finalizedFeatures().keySet()));
        }
    }
}
