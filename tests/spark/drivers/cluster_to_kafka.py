"""A Spark driver for a standalone cluster whose executors run a packed environment:
Kafka topic -> (id, uuid) -> repartition(2, uuid) -> Kafka topic with atomicity=batch,
until every input record is processed.

    cluster_to_kafka.py MASTER BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC CHECKPOINT ARCHIVE WORKDIR EXECUTORS

It runs in WORKDIR, where `session(archive=ARCHIVE)` links `environment` to the driver's
own venv. Before the query it prints one JSON line, {"executables": [...]}: the
sys.executable of a task on each executor core. Small micro-batches on a short trigger,
so a test can SIGKILL a worker while one runs. Exits 0 once `processAllAvailable` returns.
"""

from __future__ import annotations

import json
import os
import sys
import time

from onceflow.spark import checkpoint as spark_checkpoint
from onceflow.spark import session

MAX_OFFSETS_PER_TRIGGER = "50"
TRIGGER = "200 milliseconds"
EXECUTORS_WAIT_S = 60


def executable(_rows):
    import sys as sys_

    yield sys_.executable


def main(master: str, bootstrap: str, input_topic: str, output_topic: str, checkpoint: str,
         archive: str, workdir: str, executors: str) -> int:
    os.chdir(workdir)
    spark = session(master, app_name="cluster-to-kafka", archive=archive)
    # Both workers' executors registered (the list holds the driver too), so that the
    # executables job below runs a task on each.
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + EXECUTORS_WAIT_S
    while len(tracker.getExecutorInfos()) < int(executors) + 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    slots = max(spark.sparkContext.defaultParallelism, 1)
    executables = sorted(set(spark.sparkContext.parallelize(range(slots), slots)
                             .mapPartitions(executable).collect()))
    print(json.dumps({"executables": executables}), flush=True)
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
