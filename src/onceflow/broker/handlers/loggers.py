"""The BROKER_LOGGER config resource (KIP-412) over Python's logging: each logger the process
has is a config whose value is its effective level under Kafka's (log4j) names; SET changes a
logger's level at run time, DELETE makes it inherit its parent's again. The checks and
messages are Kafka's (RuntimeLoggerManager). Levels: TRACE (Python 5), DEBUG, INFO,
WARN (WARNING), ERROR, FATAL (CRITICAL). The root logger is named `root`, as in Kafka."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

ROOT = "root"
TRACE = 5
LEVELS = {"TRACE": TRACE, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
          "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
VALID_LEVELS = ", ".join(sorted(LEVELS))
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3


class LoggerError(Exception):
    """`invalid_config` says which error Kafka answers: INVALID_CONFIG or INVALID_REQUEST."""

    def __init__(self, message: str, invalid_config: bool) -> None:
        super().__init__(message)
        self.invalid_config = invalid_config


def kafka_level(level: int) -> str:
    for name in ("TRACE", "DEBUG", "INFO", "WARN", "ERROR"):
        if level <= LEVELS[name]:
            return name
    return "FATAL"


def _logger(name: str) -> logging.Logger | None:
    if name == ROOT:
        return logging.getLogger()
    found = logging.Logger.manager.loggerDict.get(name)
    return found if isinstance(found, logging.Logger) else None


def loggers() -> dict[str, str]:
    """Logger name -> effective level, root first then by name."""
    names = sorted(n for n, v in logging.Logger.manager.loggerDict.items()
                   if isinstance(v, logging.Logger))
    out = {ROOT: kafka_level(logging.getLogger().getEffectiveLevel())}
    for name in names:
        out[name] = kafka_level(logging.getLogger(name).getEffectiveLevel())
    return out


def check_node(resource_name: str, node_id: int) -> None:
    try:
        requested = int(resource_name)
    except ValueError:
        raise LoggerError(f"Node id must be an integer, but it is: {resource_name}",
                          False) from None
    if requested != node_id:
        raise LoggerError(f"Unexpected node id. Expected {node_id}, but received {requested}",
                          False)


def validate(ops) -> None:
    for op in ops:
        if op.config_operation in (OP_SET, OP_DELETE) and _logger(op.name) is None:
            raise LoggerError(f"Logger {op.name} does not exist!", True)
        if op.config_operation == OP_SET:
            if op.value not in LEVELS:
                raise LoggerError(f"Cannot set the log level of {op.name} to {op.value} as it "
                                  f"is not a supported log level. Valid log levels are "
                                  f"{VALID_LEVELS}", True)
        elif op.config_operation == OP_DELETE:
            if op.name == ROOT:
                raise LoggerError(f"Removing the log level of the {ROOT} logger is not "
                                  "allowed", False)
        elif op.config_operation in (OP_APPEND, OP_SUBTRACT):
            kind = "APPEND" if op.config_operation == OP_APPEND else "SUBTRACT"
            raise LoggerError(f"{kind} operation is not allowed for the BROKER_LOGGER "
                              "resource", False)
        else:
            raise LoggerError(f"Unknown operation type {op.config_operation} is not allowed "
                              "for the BROKER_LOGGER resource", False)


def apply(ops) -> None:
    for op in ops:
        target = _logger(op.name)
        assert target is not None  # validated
        if op.config_operation == OP_SET:
            target.setLevel(LEVELS[op.value])
            log.warning("Updated the log level of %s to %s", op.name, op.value)
        else:
            target.setLevel(logging.NOTSET)
            log.warning("Unset the log level of %s", op.name)
