"""Run the broker in the foreground until SIGTERM or SIGINT, then stop cleanly.

The standalone broker owns its process, so it also tunes the C allocator for its
traffic (`keep_freed_memory`); an embedded broker leaves its host's allocator alone.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import signal

from onceflow.broker.admin import AdminFrontendFactory
from onceflow.broker.config import BrokerConfig
from onceflow.broker.embedded import new_event_loop
from onceflow.broker.server import BrokerServer


async def serve(config: BrokerConfig, ready_message: bool = True,
                admin_frontend: AdminFrontendFactory | None = None) -> None:
    server = BrokerServer(config, admin_frontend)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready_message:
        # One line on stdout that scripts (and tests) can wait for.
        print(f"onceflow broker listening on {server.bootstrap_servers}", flush=True)
        if admin_frontend is not None and server.admin is not None:
            print(f"{server.admin.title} at {server.admin.url}", flush=True)
    await stop.wait()
    await server.stop()


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks below this come from the heap and are reused once freed; glibc's own ceiling
# for the setting (HEAP_MAX_SIZE / 2 on 64-bit). Fetch reads (up to 1 MiB per partition
# by default) and produce requests stay well below it.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
# Free memory kept at the top of the heap instead of being handed back to the kernel:
# the bound on what the broker holds on to beyond what it uses.
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Make glibc reuse freed memory for the megabyte-sized buffers of every Fetch.

    By default glibc serves such blocks with fresh mmaps or gives the heap's top back
    to the kernel as soon as a few megabytes are free; either way the next read fills
    new pages, and page faults plus zeroing cost about as much as the read itself
    (measured: half of the broker's CPU per fetched record). Fixed thresholds keep
    the pages. Returns False where mallopt is not glibc's (other libcs: no change).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


def run_broker(config: BrokerConfig, admin_frontend: AdminFrontendFactory | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not keep_freed_memory():
        logging.getLogger("onceflow.broker").info("malloc tuning unavailable (not glibc)")
    loop = new_event_loop()
    try:
        loop.run_until_complete(serve(config, admin_frontend=admin_frontend))
    finally:
        loop.close()
