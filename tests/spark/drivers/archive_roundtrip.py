"""A Spark batch job whose executors run an environment archive (`session(archive=...)`):
write ids to a Kafka topic through onceflow-kafka, read them back, and report what the
executors' Python was.

    archive_roundtrip.py MASTER BOOTSTRAP TOPIC ARCHIVE COUNT WORKDIR

It runs in WORKDIR, where session() links `environment` to the driver's own venv.

Prints one JSON line: {"ids": [...read back...], "executables": [...sys.executable of tasks...]}.
"""

from __future__ import annotations

import json
import os
import sys

from onceflow.spark import session


def executable(_rows):
    import sys as sys_

    yield sys_.executable


def main(master: str, bootstrap: str, topic: str, archive: str, count: str, workdir: str) -> int:
    os.chdir(workdir)
    spark = session(master, app_name="archive-roundtrip", archive=archive)
    slots = max(spark.sparkContext.defaultParallelism, 1)
    executables = sorted(set(spark.sparkContext.parallelize(range(slots), slots)
                             .mapPartitions(executable).collect()))
    (spark.range(int(count)).selectExpr("CAST(id AS STRING) AS value")
     .write.format("onceflow-kafka").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).mode("append").save())
    ids = [row.value for row in spark.read.format("onceflow-kafka")
           .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic).load()
           .selectExpr("CAST(value AS STRING) AS value").collect()]
    print(json.dumps({"ids": ids, "executables": executables}))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
