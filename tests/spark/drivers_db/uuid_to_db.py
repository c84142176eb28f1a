"""A Spark driver whose output depends on uuid(): Kafka topic -> onceflow-db, atomicity=batch.

    uuid_to_db.py BOOTSTRAP TOPIC TABLE CHECKPOINT URL

Each record gets a fresh uuid() and the rows are repartitioned by it (repartition(3, u)),
so a replayed micro-batch computes other values and sends each row to another write task
than the first time. Written columns: `id` (the record value), `part`, `off` (its Kafka
position, to tell which micro-batch it belongs to) and `u`. Small micro-batches so a test
can SIGKILL the driver in the middle of one; exits 0 once the topic's records are all in.
"""

from __future__ import annotations

import sys

from pyspark.sql import functions as F

from onceflow.spark import checkpoint, session

MAX_OFFSETS_PER_TRIGGER = "120"


def main(bootstrap: str, topic: str, table: str, checkpoint_dir: str, url: str) -> int:
    spark = session("local[2]", app_name="uuid-to-db", conf={"spark.sql.shuffle.partitions": "3"})
    records = (spark.readStream.format("onceflow-kafka")
               .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
               .option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", MAX_OFFSETS_PER_TRIGGER).load()
               .selectExpr("CAST(value AS STRING) AS id", "partition AS part", "offset AS off")
               .withColumn("u", F.expr("uuid()"))
               .repartition(3, "u"))
    checkpoint.remove_partial_writes(checkpoint_dir)
    query = (records.writeStream.format("onceflow-db").option("url", url).option("table", table)
             .option("atomicity", "batch").option("checkpointLocation", checkpoint_dir).start())
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
