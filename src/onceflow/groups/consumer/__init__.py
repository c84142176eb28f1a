"""Consumer groups of the consumer group protocol (KIP-848, `group.protocol=consumer`).

Sans-IO like the rest of onceflow.groups: `records.py` is the on-disk format, `member.py`
the member and its reconciliation state machine, `assignors.py` the server-side assignors,
`target.py` the target assignment and subscriptions computed as values, `group.py` the
group and its replay, `heartbeat.py` the ConsumerGroupHeartbeat rules, `coordinator.py`
the glue with the group coordinator (replay on write, timers, describe).
"""
