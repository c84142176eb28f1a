"""A Spark driver whose output and write partitioning depend on uuid(): Kafka topic ->
(id, uuid) -> repartition(3, uuid) -> Kafka topic, until every input record is processed.

    uuid_to_kafka.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC CHECKPOINT ATOMICITY PROGRESS_TOPIC

The output value is `<input value>|<uuid>`: a replayed batch computes other uuids, so other
write partitions get other rows - what the partition-level guarantee cannot survive and
atomicity=batch must. Small micro-batches on a short trigger, so a test can SIGKILL the
driver in the middle of one; run again, it resumes from the checkpoint. Exits 0 once
`processAllAvailable` returns.
"""

from __future__ import annotations

import sys

from onceflow.spark import checkpoint as spark_checkpoint
from onceflow.spark import session

MAX_OFFSETS_PER_TRIGGER = "400"
TRIGGER = "100 milliseconds"


def main(bootstrap: str, input_topic: str, output_topic: str, checkpoint: str, atomicity: str,
         progress_topic: str) -> int:
    spark = session("local[2]", app_name="uuid-to-kafka")
    spark_checkpoint.remove_partial_writes(checkpoint)  # a kill may have landed mid-write
    records = (spark.readStream.format("onceflow-kafka")
               .option("kafka.bootstrap.servers", bootstrap).option("subscribe", input_topic)
               .option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", MAX_OFFSETS_PER_TRIGGER).load()
               .selectExpr("CAST(value AS STRING) AS id", "uuid() AS u")
               .repartition(3, "u")
               .selectExpr("concat(id, '|', u) AS value"))
    query = (records.writeStream.format("onceflow-kafka")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", output_topic)
             .option("atomicity", atomicity).option("progressTopic", progress_topic)
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime=TRIGGER).start())
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
