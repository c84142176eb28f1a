"""A Spark driver for a standalone cluster: Kafka topic -> (id, uuid) -> repartition(2, uuid)
-> Kafka topic with atomicity=batch, until every input record is processed.

    cluster_to_kafka.py MASTER BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC CHECKPOINT

Small micro-batches on a short trigger, so a test can SIGKILL a worker while one runs.
Exits 0 once `processAllAvailable` returns.
"""

from __future__ import annotations

import sys

from onceflow.spark import checkpoint as spark_checkpoint
from onceflow.spark import session

MAX_OFFSETS_PER_TRIGGER = "50"
TRIGGER = "200 milliseconds"


def main(master: str, bootstrap: str, input_topic: str, output_topic: str, checkpoint: str) -> int:
    spark = session(master, app_name="cluster-to-kafka")
    spark_checkpoint.remove_partial_writes(checkpoint)
    records = (spark.readStream.format("onceflow-kafka")
               .option("kafka.bootstrap.servers", bootstrap).option("subscribe", input_topic)
               .option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", MAX_OFFSETS_PER_TRIGGER).load()
               .selectExpr("CAST(value AS STRING) AS id", "uuid() AS u")
               .repartition(2, "u")
               .selectExpr("concat(id, '|', u) AS value"))
    query = (records.writeStream.format("onceflow-kafka")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", output_topic)
             .option("atomicity", "batch")
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime=TRIGGER).start())
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
