"""onceflow.processor: Decaton-style concurrent processing of Kafka records.

Records of one partition are processed concurrently by several lanes; records with
the same key always go to the same lane, so order holds per key. Offsets are committed
out of order safely: per partition a bounded window tracks completions and the commit
position is the end of the contiguous completed run (window.py); completed offsets above
it travel in the commit metadata (offset_map.py) so a restart does not redo them.
Backpressure pauses a partition whose window is full. Failures go to a retry topic with
back-off and finally to a dead-letter topic. An exactly-once mode commits the outputs
and the offsets in one transaction per commit interval.

Module map:

| module | concern |
|---|---|
| processor.py | `Processor`: builds the clients, start/stop/run_forever, statistics |
| subscription.py | the loop: poll, accept, dispatch, backpressure, rebalance, shutdown |
| partition.py | `PartitionContext`: window + ready queue + lanes of one partition |
| window.py | `OffsetWindow`: pure out-of-order commit control |
| offset_map.py | completed offsets above the watermark, in the commit metadata |
| lanes.py | lanes, worker threads (`ThreadEngine`), asyncio (`AsyncEngine`) |
| commit.py | offset commits, transactions, at-least-once output delivery |
| retry.py | retry and dead-letter records and their headers |
| ratelimit.py, routing.py | token bucket; key -> lane |
| metrics.py | Prometheus metrics |
| config.py, record.py, errors.py | the public types |
"""

from onceflow.processor.config import ProcessorConfig, Properties, RetryPolicy
from onceflow.processor.errors import ProcessorError
from onceflow.processor.processor import PartitionStatistics, Processor, ProcessorStatistics
from onceflow.processor.record import Completion, Output, Record

__all__ = [
    "Completion",
    "Output",
    "PartitionStatistics",
    "Processor",
    "ProcessorConfig",
    "ProcessorError",
    "ProcessorStatistics",
    "Properties",
    "Record",
    "RetryPolicy",
]
