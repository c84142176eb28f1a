"""A Spark driver: Kafka topic -> onceflow-db table(s), until the topic's records are all in.

    kafka_to_db.py BOOTSTRAP TOPIC TABLE CHECKPOINT_ROOT URL [URL ...]

One streaming query per database URL (checkpoint CHECKPOINT_ROOT/<index>), each writing
`id` (the record value as text), `part` and `off` to TABLE. Small micro-batches
(maxOffsetsPerTrigger) so a test can SIGKILL the driver in the middle of one. Once every
query has processed everything the topic held at start, it stops them and exits 0; run
again after a kill, it resumes from the checkpoints.
"""

from __future__ import annotations

import sys

from onceflow.spark import checkpoint, session

MAX_OFFSETS_PER_TRIGGER = "120"


def main(bootstrap: str, topic: str, table: str, checkpoint_root: str, *urls: str) -> int:
    spark = session("local[2]", app_name="kafka-to-db", conf={"spark.sql.shuffle.partitions": "2"})
    records = (spark.readStream.format("onceflow-kafka")
               .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
               .option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", MAX_OFFSETS_PER_TRIGGER).load()
               .selectExpr("CAST(value AS STRING) AS id", "partition AS part", "offset AS off"))
    for index in range(len(urls)):  # a kill may have landed in Spark's write of offsets/0
        checkpoint.remove_partial_writes(f"{checkpoint_root}/{index}")
    queries = [records.writeStream.format("onceflow-db").option("url", url)
               .option("table", table).queryName(f"to_db_{index}")
               .option("checkpointLocation", f"{checkpoint_root}/{index}").start()
               for index, url in enumerate(urls)]
    for query in queries:
        query.processAllAvailable()
    for query in queries:
        query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
