"""A processor in its own process, for the crash tests (SIGKILL, restart).

    worker.py MODE BOOTSTRAP GROUP TOPIC LOG_PATH SESSION_TIMEOUT_MS [STALL]

MODE "log": at-least-once; each processed record appends "partition offset" to LOG_PATH
(one unbuffered O_APPEND write, so a SIGKILL never leaves a record half-logged but
logged). With STALL=1 the record at offset 5 of every partition hangs, which holds the
watermark while later records complete: the offset map has to carry them.

MODE "eos": exactly-once; every input record produces one output to "<TOPIC>-out" whose
value names the input; LOG_PATH gets the same lines as in "log" mode.

SIGTERM stops the processor gracefully (drain, commit).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import time

from onceflow.processor import Output, Processor, ProcessorConfig

STALL_OFFSET = 5
STALL_S = 120.0


def main() -> None:
    if os.environ.get("ONCEFLOW_WORKER_LOG"):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    mode, bootstrap, group, topic, log_path, session_timeout_ms = sys.argv[1:7]
    stall = len(sys.argv) > 7 and sys.argv[7] == "1"
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def handle(record):
        if stall and record.offset == STALL_OFFSET:
            time.sleep(STALL_S)
        # Slow enough in eos mode that each SIGKILL lands in the middle of the work.
        time.sleep(random.uniform(0.005, 0.015) if mode == "eos" else random.random() * 0.004)
        os.write(log_fd, f"{record.partition} {record.offset}\n".encode())
        if mode == "eos":
            value = f"{record.topic}:{record.partition}:{record.offset}".encode()
            return Output(f"{topic}-out", value, record.key)
        return None

    config = ProcessorConfig(
        concurrency=2 if mode == "eos" else 16,
        commit_interval_ms=100 if mode == "eos" else 200,
        exactly_once=mode == "eos",
        transactional_id=f"{group}-worker" if mode == "eos" else None,
        transaction_timeout_ms=10_000,
        revoke_timeout_ms=2000,
        shutdown_timeout_ms=5000,
    )
    consumer_config = {
        "session.timeout.ms": int(session_timeout_ms),
        "heartbeat.interval.ms": 500,
        # Static membership: on a real broker a restarted worker takes its predecessor's
        # place without waiting for the session timeout (the mock ignores it).
        "group.instance.id": f"{group}-worker",
    }
    processor = Processor(
        bootstrap_servers=bootstrap,
        group_id=group,
        topics=[topic],
        handler=handle,
        config=config,
        consumer_config=consumer_config,
    )
    signal.signal(signal.SIGTERM, lambda *_: processor.stop())
    processor.run_forever()


if __name__ == "__main__":
    main()
