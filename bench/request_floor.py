"""What one small request costs the broker, next to what it costs a server that does
nothing: the same frames at the same rate to onceflow and to a bare uvloop server.

    PYTHONPATH=src .venv/bin/python bench/request_floor.py                # 2,000/s, 6 s
    PYTHONPATH=src .venv/bin/python bench/request_floor.py --rate 5000

Theory of operation: issue 19 asks for broker CPU per small request. Part of that cost is
not the broker's Python at all: the event loop waking, one recv and one send per request,
the kernel's TCP work on loopback, a vCPU leaving idle. To tell the two apart, one raw
socket client sends the Produce v9 request librdkafka sends for one
100-byte record (acks=1) at a fixed rate, reading each answer, first to `onceflow broker`
(child process, fsync on) and then to a floor server (child process: uvloop, a buffered
protocol that splits size-prefixed frames and answers each with a fixed 40-byte frame,
nothing else). Printed for each: CPU per request, user and system, from /proc. The floor
is what any Python server on asyncio pays on this machine for the same traffic.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from request_path import produce_frame
from throughput import CpuClock, create_topic_via_admin, free_port, onceflow_process

TOPIC = "request-path"   # the topic request_path.produce_frame names
TICKS_PER_S = os.sysconf("SC_CLK_TCK")

FLOOR_SERVER = textwrap.dedent("""
    import asyncio, struct, sys, uvloop
    ANSWER = struct.pack(">i", 40) + bytes(40)
    class Floor(asyncio.BufferedProtocol):
        def connection_made(self, transport):
            self.t, self.buf, self.n = transport, bytearray(65536), 0
        def get_buffer(self, hint):
            return memoryview(self.buf)[self.n:]
        def buffer_updated(self, nbytes):
            self.n += nbytes
            pos, answers = 0, 0
            while self.n - pos >= 4:
                (size,) = struct.unpack_from(">i", self.buf, pos)
                if self.n - pos < 4 + size:
                    break
                pos += 4 + size
                answers += 1
            if answers:
                self.t.write(ANSWER * answers)
            self.buf[: self.n - pos] = self.buf[pos : self.n]
            self.n -= pos
    async def main():
        server = await asyncio.get_running_loop().create_server(Floor, "127.0.0.1", int(sys.argv[1]))
        print("listening", flush=True)
        await server.serve_forever()
    uvloop.run(main())
""")


def cpu_ticks(pid: int) -> tuple[int, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])   # utime, stime


def drive(address: tuple[str, int], frame: bytes, rate: int, seconds: float, pid: int) -> str:
    """Send `frame` (size prefix added) `rate` times a second, one at a time, reading each
    answer; the server's CPU over the run, per request."""
    sent = struct.pack(">i", len(frame)) + frame
    with socket.create_connection(address) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = sock.makefile("rb")

        def one() -> None:
            sock.sendall(sent)
            (size,) = struct.unpack(">i", reader.read(4))
            reader.read(size)

        for _ in range(200):   # warm up
            one()
        requests = int(rate * seconds)
        user0, system0 = cpu_ticks(pid)
        start = time.perf_counter()
        for i in range(requests):
            due = start + i / rate
            while (now := time.perf_counter()) < due:
                time.sleep(due - now)
            one()
        elapsed = time.perf_counter() - start
        user1, system1 = cpu_ticks(pid)
    user_us = (user1 - user0) / TICKS_PER_S / requests * 1e6
    system_us = (system1 - system0) / TICKS_PER_S / requests * 1e6
    share = ((user1 - user0) + (system1 - system0)) / TICKS_PER_S / elapsed * 100
    return (f"{user_us + system_us:6.1f} us per request (user {user_us:5.1f}, system "
            f"{system_us:5.1f}), {share:3.0f} % of a core, {requests / elapsed:,.0f} requests/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=2000, help="requests per second")
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    frame = produce_frame(1)
    print(f"one-record Produce v9 requests (acks=1, {len(frame)} B), {args.rate:,}/s for "
          f"{args.seconds:.0f} s, one at a time over one connection")
    cpu = CpuClock()
    with (tempfile.TemporaryDirectory(prefix="onceflow-bench-request-floor-") as tmp,
          onceflow_process(Path(tmp) / "data", fsync=True, cpu=cpu) as bootstrap):
        create_topic_via_admin(bootstrap, TOPIC, 1)
        host, port = bootstrap.split(":")
        result = drive((host, int(port)), frame, args.rate, args.seconds, cpu.broker_pid)
        print(f"onceflow broker: {result}")
    port = free_port()
    floor = subprocess.Popen([sys.executable, "-c", FLOOR_SERVER, str(port)],
                             stdout=subprocess.PIPE, text=True)
    try:
        floor.stdout.readline()
        print(f"floor server:    {drive(('127.0.0.1', port), frame, args.rate, args.seconds, floor.pid)}")
    finally:
        floor.kill()
        floor.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
