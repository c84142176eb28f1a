"""What an idle connection costs the broker: its RSS with N answered connections open.

    .venv/bin/python bench/connections.py                    # 10,000 PLAINTEXT, 1,000 SASL_SSL
    .venv/bin/python bench/connections.py --connections 2000 --tls-connections 0

Theory of operation: `onceflow broker` runs in a child process (so its RSS is its own;
it raises its soft RLIMIT_NOFILE to the hard limit itself, this process does the same
for its own sockets). For each listener type in turn (a fresh broker each, PLAINTEXT
then SASL_SSL with SCRAM-SHA-512 and a throw-away trustme CA) the benchmark opens N
connections one after another, sends one ApiVersions v0 request on each and reads its
answer, so every connection is a real, answered Kafka connection - then leaves them idle.
SASL_SSL connections shake hands (TLS) but do not authenticate: a client that has not
logged in yet is what a broker holds while a crowd of clients connects. The broker's
VmRSS (from /proc) is read before, with all N open (after a settling pause), and after
all are closed; the difference divided by N is the cost of one idle connection. The
output is a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import resource
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import trustme

CONNECTIONS_DEFAULT = 10_000
TLS_CONNECTIONS_DEFAULT = 1_000
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
# After opening or closing: let the broker finish what the last connections started
# (and the allocator settle) before reading its RSS.
SETTLE_S = 2.0
ANSWER_BYTES_MAX = 1 << 20
# ApiVersions v0, request header v1: api_key 18, api_version 0, correlation id, client id.
CLIENT_ID = b"bench-connections"
API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, 1, len(CLIENT_ID)) + CLIENT_ID
API_VERSIONS_REQUEST = struct.pack(">i", len(API_VERSIONS_V0)) + API_VERSIONS_V0


class BenchError(Exception):
    pass


def raise_nofile_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"no VmRSS for pid {pid}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def broker(directory: Path, protocol: str) -> Iterator[tuple[int, int, ssl.SSLContext | None]]:
    """`onceflow broker` with one `protocol` listener: (pid, port, client TLS context)."""
    port = free_port()
    command = [sys.executable, "-m", "onceflow", "broker", "--data-dir",
               str(directory / f"data-{protocol}"), "--no-fsync",
               "--listeners", f"{protocol}://127.0.0.1:{port}"]
    client_tls = None
    if protocol != "PLAINTEXT":
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1")
        cert_file, key_file = directory / "server.pem", directory / "server.key"
        server.private_key_pem.write_to_path(str(key_file))
        cert_file.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
        client_tls = ssl.create_default_context()
        ca.configure_trust(client_tls)
        command += ["--ssl-certfile", str(cert_file), "--ssl-keyfile", str(key_file),
                    "--sasl-mechanisms", "SCRAM-SHA-512",
                    "--add-scram", "SCRAM-SHA-512=[name=bench,password=bench-secret]"]
    log_path = directory / f"broker-{protocol}.log"
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "onceflow broker up" not in log_path.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the broker did not start:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        yield process.pid, port, client_tls
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def read_exactly(sock: socket.socket, count: int) -> bytes:
    chunks, missing = [], count
    while missing:
        chunk = sock.recv(missing)
        if not chunk:
            raise BenchError("the broker closed a connection")
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def open_answered(port: int, client_tls: ssl.SSLContext | None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    if client_tls is not None:
        sock = client_tls.wrap_socket(sock, server_hostname="127.0.0.1")
    sock.sendall(API_VERSIONS_REQUEST)
    size = struct.unpack(">i", read_exactly(sock, 4))[0]
    if not 0 < size <= ANSWER_BYTES_MAX:
        raise BenchError(f"bad answer size {size}")
    read_exactly(sock, size)
    return sock


def measure(directory: Path, protocol: str, count: int) -> dict[str, float]:
    with broker(directory, protocol) as (pid, port, client_tls):
        time.sleep(SETTLE_S)
        before = rss_bytes(pid)
        start = time.monotonic()
        sockets = [open_answered(port, client_tls) for _ in range(count)]
        open_s = time.monotonic() - start
        time.sleep(SETTLE_S)
        opened = rss_bytes(pid)
        for sock in sockets:
            sock.close()
        time.sleep(SETTLE_S)
        closed = rss_bytes(pid)
    return {"before": before, "open": opened, "closed": closed, "open_s": open_s,
            "per_connection": (opened - before) / count}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=CONNECTIONS_DEFAULT,
                        help="PLAINTEXT connections (0: skip)")
    parser.add_argument("--tls-connections", type=int, default=TLS_CONNECTIONS_DEFAULT,
                        help="SASL_SSL connections (0: skip)")
    args = parser.parse_args(argv)
    limit = raise_nofile_limit()
    if max(args.connections, args.tls_connections) + 100 > limit:
        raise BenchError(f"RLIMIT_NOFILE hard limit {limit} is too low for this many sockets")
    print(f"Python {platform.python_version()}, {platform.system()} {platform.release()}, "
          f"command: {' '.join(['bench/connections.py', *argv])}\n")
    print("| listener | connections | broker RSS before | with all open | per connection "
          "| after closing | opening took |")
    print("|---|---|---|---|---|---|---|")
    mib = 1 << 20
    with tempfile.TemporaryDirectory(prefix="onceflow-bench-") as tmp:
        for protocol, count in (("PLAINTEXT", args.connections),
                                ("SASL_SSL", args.tls_connections)):
            if count <= 0:
                continue
            r = measure(Path(tmp), protocol, count)
            print(f"| {protocol} | {count:,} | {r['before'] / mib:.1f} MiB "
                  f"| {r['open'] / mib:.1f} MiB | {r['per_connection'] / 1024:.1f} KiB "
                  f"| {r['closed'] / mib:.1f} MiB | {r['open_s']:.1f} s |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
