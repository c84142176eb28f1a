import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterClientQuotasOptions;
import org.apache.kafka.common.quota.ClientQuotaAlteration;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.quota.ClientQuotaFilterComponent;

/** The Java AdminClient's alterClientQuotas and describeClientQuotas.
 *  Usage: ClientQuotas BOOTSTRAP USER. Sets producer_byte_rate 1048576 for USER and
 *  consumer_byte_rate 2048 for the client-id default, removes nothing, then describes
 *  USER (strict) and every entity with a client-id, and tries an unknown key.
 *  Prints {"user": {...}, "clients": {...}, "bad_key_error": "..."}. */
public class ClientQuotas {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        String user = args[1];
        try (Admin admin = Admin.create(p)) {
            ClientQuotaEntity userEntity = new ClientQuotaEntity(Map.of(ClientQuotaEntity.USER, user));
            Map<String, String> clientDefault = new java.util.HashMap<>();
            clientDefault.put(ClientQuotaEntity.CLIENT_ID, null);
            ClientQuotaEntity clientEntity = new ClientQuotaEntity(clientDefault);
            admin.alterClientQuotas(List.of(
                new ClientQuotaAlteration(userEntity, List.of(
                    new ClientQuotaAlteration.Op("producer_byte_rate", 1048576.0))),
                new ClientQuotaAlteration(clientEntity, List.of(
                    new ClientQuotaAlteration.Op("consumer_byte_rate", 2048.0))))).all().get();
            Map<ClientQuotaEntity, Map<String, Double>> users = admin.describeClientQuotas(
                ClientQuotaFilter.containsOnly(List.of(ClientQuotaFilterComponent.ofEntity(
                    ClientQuotaEntity.USER, user)))).entities().get();
            Map<ClientQuotaEntity, Map<String, Double>> clients = admin.describeClientQuotas(
                ClientQuotaFilter.contains(List.of(ClientQuotaFilterComponent.ofEntityType(
                    ClientQuotaEntity.CLIENT_ID)))).entities().get();
            String badKeyError = "";
            try {
                admin.alterClientQuotas(List.of(new ClientQuotaAlteration(userEntity, List.of(
                    new ClientQuotaAlteration.Op("bogus_rate", 1.0)))),
                    new AlterClientQuotasOptions()).all().get();
            } catch (Exception e) {
                badKeyError = e.getCause() == null ? e.toString() : e.getCause().getClass().getSimpleName()
                    + ": " + e.getCause().getMessage();
            }
            System.out.println("{\"user\": " + json(users) + ", \"clients\": " + json(clients)
                + ", \"bad_key_error\": \"" + badKeyError.replace("\"", "'") + "\"}");
        }
    }

    /** {"user=alice": {"producer_byte_rate": 1048576.0}} with entities and keys sorted. */
    static String json(Map<ClientQuotaEntity, Map<String, Double>> entities) {
        Map<String, Map<String, Double>> sorted = new TreeMap<>();
        for (Map.Entry<ClientQuotaEntity, Map<String, Double>> e : entities.entrySet()) {
            StringBuilder name = new StringBuilder();
            for (Map.Entry<String, String> part : new TreeMap<>(e.getKey().entries()).entrySet()) {
                name.append(name.length() == 0 ? "" : ",").append(part.getKey()).append('=')
                    .append(part.getValue() == null ? "<default>" : part.getValue());
            }
            sorted.put(name.toString(), new TreeMap<>(e.getValue()));
        }
        StringBuilder out = new StringBuilder("{");
        for (Map.Entry<String, Map<String, Double>> e : sorted.entrySet()) {
            out.append(out.length() == 1 ? "" : ", ").append('"').append(e.getKey()).append("\": {");
            int i = 0;
            for (Map.Entry<String, Double> v : e.getValue().entrySet()) {
                out.append(i++ == 0 ? "" : ", ").append('"').append(v.getKey()).append("\": ").append(v.getValue());
            }
            out.append('}');
        }
        return out.append('}').toString();
    }
}
