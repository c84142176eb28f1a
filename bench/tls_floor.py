"""The floor of TLS in Python: what decrypting the bytes of a produce costs the broker.

    .venv/bin/python bench/tls_floor.py            # 200 MiB per cipher, 64 KiB writes

Theory of operation: a TLS client and server as `ssl.SSLObject`s over memory BIOs - the
same path asyncio's and uvloop's TLS transports take - shake hands in-process (a
trustme certificate). The client encrypts the whole load in writes of `--write-bytes`
(librdkafka's writes are of that order); then only the server side is timed: the
encrypted bytes go into its incoming BIO and are read out with `SSLObject.read(n,
buffer)` into one reused buffer of `--read-bytes`, as the broker reads into its frame
buffers. The result is CPU time per KiB of plaintext: no sockets, no event loop, no
Kafka - nothing the broker could save. Run for TLS 1.3 (its default suite) and for the
TLS 1.2 AEAD suites a server can prefer.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import tempfile
import time
from pathlib import Path

import trustme

MIB = 1 << 20
TOTAL_MIB_DEFAULT = 200
WRITE_BYTES_DEFAULT = 64 * 1024
READ_BYTES_DEFAULT = 256 * 1024
HANDSHAKE_ROUNDS_MAX = 10
# (TLS version, TLS 1.2 cipher string or None for the version's default)
SUITES = (
    (ssl.TLSVersion.TLSv1_3, None),
    (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES256-GCM-SHA384"),
    (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES128-GCM-SHA256"),
    (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-CHACHA20-POLY1305"),
)


def contexts(directory: Path, version: ssl.TLSVersion,
             cipher: str | None) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(directory / "server.pem"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(directory / "server.pem")
    client = ssl.create_default_context(cafile=str(directory / "ca.pem"))
    for context in (server, client):
        context.minimum_version = context.maximum_version = version
        if cipher is not None:
            context.set_ciphers(cipher)
    return server, client


def decrypt_us_per_kib(directory: Path, version: ssl.TLSVersion, cipher: str | None,
                       total_bytes: int, write_bytes: int,
                       read_bytes: int) -> tuple[str, float]:
    server_context, client_context = contexts(directory, version, cipher)
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server = server_context.wrap_bio(server_in, server_out, server_side=True)
    client = client_context.wrap_bio(client_in, client_out, server_hostname="127.0.0.1")
    for _ in range(HANDSHAKE_ROUNDS_MAX):
        for side in (client, server):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
    payload = os.urandom(write_bytes)
    wire = []
    for _ in range(total_bytes // write_bytes):
        client.write(payload)
        wire.append(client_out.read())
    buffer = memoryview(bytearray(read_bytes))
    received = 0
    start_s = time.process_time()
    for chunk in wire:
        server_in.write(chunk)
        while server_in.pending or server.pending():
            try:
                received += server.read(read_bytes, buffer)
            except ssl.SSLWantReadError:
                break
    seconds = time.process_time() - start_s
    if received != total_bytes // write_bytes * write_bytes:
        raise AssertionError(f"received {received} bytes")
    return f"{server.version()} {server.cipher()[0]}", seconds / (received / 1024) * 1e6


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total-mib", type=int, default=TOTAL_MIB_DEFAULT)
    parser.add_argument("--write-bytes", type=int, default=WRITE_BYTES_DEFAULT)
    parser.add_argument("--read-bytes", type=int, default=READ_BYTES_DEFAULT)
    args = parser.parse_args(argv)
    print(f"{ssl.OPENSSL_VERSION}; {args.total_mib} MiB in writes of {args.write_bytes} B, "
          f"reads of up to {args.read_bytes} B\n")
    print("| suite | server decrypt µs per KiB | MB/s |\n|---|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="onceflow-tls-floor-") as tmp:
        for version, cipher in SUITES:
            suite, us_per_kib = decrypt_us_per_kib(Path(tmp), version, cipher,
                                                   args.total_mib * MIB, args.write_bytes,
                                                   args.read_bytes)
            print(f"| {suite} | {us_per_kib:.2f} | {1024 / us_per_kib:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
