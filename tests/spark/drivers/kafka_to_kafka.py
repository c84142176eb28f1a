"""A Spark driver: Kafka topic -> transformation -> Kafka topic through the exactly-once sink,
until every record the input held at start is processed.

    kafka_to_kafka.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC CHECKPOINT

Small micro-batches (maxOffsetsPerTrigger) on a short processing-time trigger, so a test can
SIGKILL the driver in the middle of one; run again after a kill, it resumes from the
checkpoint (Spark replays the batch that was in flight). Exits 0 once `processAllAvailable`
returns, i.e. the output covers all input.
"""

from __future__ import annotations

import sys

from onceflow.spark import checkpoint as spark_checkpoint
from onceflow.spark import session

MAX_OFFSETS_PER_TRIGGER = "1500"
TRIGGER = "100 milliseconds"
# Short, so a transaction left open by a killed driver is aborted soon even if nothing
# re-initialises its transactional id (a restart does, at once).
TRANSACTION_TIMEOUT_MS = "20000"


def main(bootstrap: str, input_topic: str, output_topic: str, checkpoint: str) -> int:
    spark = session("local[2]", app_name="kafka-to-kafka")
    spark_checkpoint.remove_partial_writes(checkpoint)  # a kill may have landed mid-write
    records = (spark.readStream.format("onceflow-kafka")
               .option("kafka.bootstrap.servers", bootstrap).option("subscribe", input_topic)
               .option("startingOffsets", "earliest").option("includeHeaders", "true")
               .option("maxOffsetsPerTrigger", MAX_OFFSETS_PER_TRIGGER).load()
               .selectExpr("key", "concat(CAST(value AS STRING), '|copied') AS value", "headers"))
    query = (records.writeStream.format("onceflow-kafka")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", output_topic)
             .option("kafka.transaction.timeout.ms", TRANSACTION_TIMEOUT_MS)
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime=TRIGGER).start())
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
