"""Kafka clients of onceflow's own, beside the broker: they speak the Kafka protocol
(`onceflow.protocol`) to any Kafka-compatible cluster and never import the broker.
`wire` is a small blocking client for the APIs confluent-kafka does not expose."""
