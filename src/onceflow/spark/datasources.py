"""The data source classes Spark instantiates by format name.

Each class only routes Spark's calls to the reader or writer module that implements them,
so `spark.readStream.format("onceflow-kafka")` and `df.writeStream.format("onceflow-kafka")`
share one name, as Spark's own Kafka connector does. Options are Spark's case-insensitive
map; the modules document the ones they read.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType


class KafkaDataSource(DataSource):
    """`onceflow-kafka`: Kafka topics as a source (batch and streaming) and an exactly-once
    sink (streaming; batch writes are one transaction per task)."""

    @classmethod
    def name(cls) -> str:
        return "onceflow-kafka"

    def schema(self) -> StructType:
        from onceflow.spark import source

        return source.kafka_schema(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        from onceflow.spark import source

        return source.KafkaBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from onceflow.spark import source

        return source.KafkaStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from onceflow.spark import kafka_sink

        return kafka_sink.KafkaBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from onceflow.spark import kafka_sink

        return kafka_sink.KafkaStreamWriter(self.options, schema)


class DatabaseDataSource(DataSource):
    """`onceflow-db`: an exactly-once sink into SQLite or PostgreSQL."""

    @classmethod
    def name(cls) -> str:
        return "onceflow-db"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from onceflow.spark import db_sink

        return db_sink.DatabaseBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from onceflow.spark import db_sink

        return db_sink.DatabaseStreamWriter(self.options, schema, overwrite)
