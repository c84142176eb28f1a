"""Run the broker in the foreground until SIGTERM or SIGINT, then stop cleanly."""

from __future__ import annotations

import asyncio
import logging
import signal

from onceflow.broker.config import BrokerConfig
from onceflow.broker.embedded import new_event_loop
from onceflow.broker.server import BrokerServer


async def serve(config: BrokerConfig, ready_message: bool = True) -> None:
    server = BrokerServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready_message:
        # One line on stdout that scripts (and tests) can wait for.
        print(f"onceflow broker listening on {server.bootstrap_servers}", flush=True)
    await stop.wait()
    await server.stop()


def run_broker(config: BrokerConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    loop = new_event_loop()
    try:
        loop.run_until_complete(serve(config))
    finally:
        loop.close()
