// Drives the onceflow broker with kafkajs (its own protocol implementation, not librdkafka)
// and prints one JSON line describing what it saw. Usage:
//   node kafkajs_check.js BOOTSTRAP TOPIC OFFSETS_TOPIC GROUP
// Steps: create topics; idempotent producer; a committed and an aborted transaction; a
// transaction that also commits consumer offsets (sendOffsets); a read_committed group
// consumer that reads the topic back. The Python test checks the JSON and cross-reads the
// topic with confluent-kafka.
const { Kafka, logLevel } = require("kafkajs");

const [bootstrap, topic, offsetsTopic, groupId] = process.argv.slice(2);
const PLAIN = 1000, COMMITTED = 100, ABORTED = 50;
const kafka = new Kafka({ clientId: "kafkajs-check", brokers: bootstrap.split(","), logLevel: logLevel.ERROR });

function message(kind, i) {
  return { key: `${kind}-${i}`, value: JSON.stringify({ kind, i }), headers: { kind } };
}

async function produce() {
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 3 }, { topic: offsetsTopic, numPartitions: 1 }] });
  await admin.disconnect();

  const idempotent = kafka.producer({ idempotent: true, maxInFlightRequests: 5 });
  await idempotent.connect();
  for (let start = 0; start < PLAIN; start += 100) {
    const messages = [];
    for (let i = start; i < start + 100; i++) messages.push(message("plain", i));
    await idempotent.send({ topic, acks: -1, messages });
  }
  await idempotent.disconnect();

  const transactional = kafka.producer({ transactionalId: `${groupId}-txn`, idempotent: true, maxInFlightRequests: 1 });
  await transactional.connect();
  let txn = await transactional.transaction();
  await txn.send({ topic, messages: Array.from({ length: COMMITTED }, (_, i) => message("committed", i)) });
  await txn.sendOffsets({ consumerGroupId: groupId, topics: [{ topic: offsetsTopic, partitions: [{ partition: 0, offset: "42" }] }] });
  await txn.commit();
  txn = await transactional.transaction();
  await txn.send({ topic, messages: Array.from({ length: ABORTED }, (_, i) => message("aborted", i)) });
  await txn.abort();
  await transactional.disconnect();
}

async function consume() {
  const consumer = kafka.consumer({ groupId: `${groupId}-reader`, readUncommitted: false });
  await consumer.connect();
  await consumer.subscribe({ topics: [topic], fromBeginning: true });
  const seen = { plain: 0, committed: 0, aborted: 0, headers_ok: 0 };
  const expected = PLAIN + COMMITTED;
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`read ${JSON.stringify(seen)} of ${expected} in 60 s`)), 60000);
    consumer.run({
      eachMessage: async ({ message: m }) => {
        const body = JSON.parse(m.value.toString());
        seen[body.kind] += 1;
        if (m.headers.kind && m.headers.kind.toString() === body.kind) seen.headers_ok += 1;
        if (seen.plain + seen.committed + seen.aborted >= expected) {
          clearTimeout(timer);
          resolve();
        }
      },
    }).catch(reject);
  });
  // Let a late aborted record show itself if the broker wrongly delivered one.
  await new Promise((r) => setTimeout(r, 500));
  await consumer.disconnect();
  return seen;
}

async function committedOffset() {
  const admin = kafka.admin();
  await admin.connect();
  const offsets = await admin.fetchOffsets({ groupId, topics: [offsetsTopic] });
  await admin.disconnect();
  return Number(offsets[0].partitions[0].offset);
}

(async () => {
  await produce();
  const seen = await consume();
  const groupOffset = await committedOffset();
  console.log(JSON.stringify({ seen, group_offset: groupOffset }));
})().catch((error) => {
  console.error(error);
  process.exit(1);
});
