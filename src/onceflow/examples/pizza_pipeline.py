"""The seeds' pizza example as a pipeline: income from pizza orders, exactly once.

Input: the `orders` topic, one JSON order per record, e.g.
    {"order_id": "order-000042", "meal": "Pizza", "value": 12.50}
Output, exactly once however often the driver dies:
    * topic `pizza-income`: one income event per pizza order, keyed by order id,
      {"order_id": "order-000042", "income_cents": 1250};
    * SQLite table `pizza_orders` (order_id, meal, income_cents): the same events;
    * SQLite table `pizza_totals` (meal, orders, income_cents): the running total, a
      streaming aggregation Spark keeps in its checkpoint, rewritten every batch (complete
      output mode) and upserted on `meal`, so a replayed batch overwrites the same row.

Run it against any broker (the checkpoint and the database go under $PIZZA_DATA_DIR,
default ./data/pizza):

    onceflow pipeline run src/onceflow/examples/pizza_pipeline.py -b 127.0.0.1:9092

Money is counted in integer cents: the value is parsed as DECIMAL(10,2), so no float
rounding makes two runs disagree in the last digit. Every function here is deterministic,
as replays require.
"""

from __future__ import annotations

import os
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from onceflow.spark.pipeline import DatabaseSink, KafkaSink, KafkaSource, Pipeline

DATA_DIR = Path(os.environ.get("PIZZA_DATA_DIR", "data/pizza")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)  # SQLite creates the file, not its directory
DATABASE_URL = f"sqlite:///{DATA_DIR / 'pizza.db'}"
ORDERS_TOPIC = "orders"
INCOME_TOPIC = "pizza-income"
ORDER_SCHEMA = "order_id STRING, meal STRING, value DECIMAL(10,2)"
# Records per micro-batch and query: small enough that a demo sees several batches.
RECORDS_PER_TRIGGER = int(os.environ.get("PIZZA_RECORDS_PER_TRIGGER", "1000"))


def keep_pizza_orders(records: DataFrame) -> DataFrame:
    """Kafka records -> pizza orders (order_id, meal, income_cents); other meals and
    records that are not valid orders are dropped."""
    orders = records.select(F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("order"))
    return (orders.where(F.col("order.meal") == "Pizza")
            .select("order.order_id", "order.meal",
                    (F.col("order.value") * 100).cast("long").alias("income_cents")))


def as_income_events(pizza: DataFrame) -> DataFrame:
    """The Kafka sink's columns: key = order id, value = the JSON event."""
    return pizza.select(F.col("order_id").alias("key"),
                        F.to_json(F.struct("order_id", "income_cents")).alias("value"))


def total_by_meal(pizza: DataFrame) -> DataFrame:
    """The running total: one row per meal (only Pizza passes the filter)."""
    return pizza.groupBy("meal").agg(F.count("*").alias("orders"),
                                     F.sum("income_cents").alias("income_cents"))


pipeline = Pipeline(
    name="pizza-income",
    source=KafkaSource(topics=[ORDERS_TOPIC], starting_offsets="earliest",
                       max_records_per_trigger=RECORDS_PER_TRIGGER),
    transform=keep_pizza_orders,
    sinks=[
        KafkaSink(topic=INCOME_TOPIC, transform=as_income_events),
        DatabaseSink(url=DATABASE_URL, table="pizza_orders"),
        DatabaseSink(url=DATABASE_URL, table="pizza_totals", transform=total_by_meal,
                     output_mode="complete", mode="upsert", key_columns=["meal"]),
    ],
    checkpoint=str(DATA_DIR / "checkpoints"),
    trigger_seconds=1.0,
)
