"""Exactly-once pipelines on Spark, through PySpark's Python Data Source API (pyspark >= 4.2).

Theory of operation. Spark plans micro-batches on the driver and runs one task per input
partition on the executors. onceflow plugs in at both ends:

* `onceflow-kafka` as a source (`spark/source.py`): one input partition per topic-partition;
  a micro-batch's offsets are a JSON map {topic: {partition: next offset}} that Spark keeps
  in its checkpoint, so a replayed batch reads exactly the same records. It reads with
  confluent-kafka in the executors, `read_committed` by default, and never stalls on the
  offsets taken by control markers and aborted records.
* `onceflow-kafka` as a sink (`spark/kafka_sink.py`): each write task is one Kafka
  transaction whose transactional id is derived from (query id, partition id), holding the
  task's rows and a progress record (query, batch, partition) in a compacted progress
  topic. A retried or zombie attempt is fenced by the epoch bump; a replayed batch skips the
  partitions whose progress record is committed.
* `onceflow-db` as a sink (`spark/db_sink.py`): the rows and the same progress marker in one
  database transaction (SQLite by default, PostgreSQL as a server).
* `spark/pipeline.py`: source -> transformation -> sinks, run by `onceflow pipeline run`.

Import cost: importing this package does not import pyspark; `register` and `session` do.
"""

from __future__ import annotations

from onceflow.spark.session import register, session

KAFKA_FORMAT = "onceflow-kafka"
DATABASE_FORMAT = "onceflow-db"

__all__ = ["DATABASE_FORMAT", "KAFKA_FORMAT", "register", "session"]
