"""onceflow: exactly-once stream processing for Python.

`Broker` runs a Kafka-compatible broker in-process; see docs/architecture.md.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Imported lazily so that `import onceflow.protocol` stays free of the broker.
    if name == "Broker":
        from onceflow.node import Broker  # the embedded broker, with console=True

        return Broker
    raise AttributeError(name)


__all__ = ["Broker", "__version__"]
