"""Throw-away certificates for the security tests (trustme: a CA, a server, clients)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import trustme
from cryptography import x509


@dataclasses.dataclass(frozen=True)
class Certs:
    ca: trustme.CA
    ca_file: Path       # the CA certificate, PEM
    cert_file: Path     # the server's certificate chain, PEM
    key_file: Path      # the server's private key, PEM

    def client(self, directory: Path, name: str, common_name: str,
               organization_unit: str | None = None) -> tuple[Path, Path, str]:
        """A client certificate (chain, key) signed by the CA, and its subject as RFC 4514
        text (Kafka's principal for it is `User:` + that)."""
        cert = self.ca.issue_cert(f"{name}.client.test", common_name=common_name,
                                  organization_unit_name=organization_unit)
        chain, key = directory / f"{name}.pem", directory / f"{name}.key"
        cert.private_key_pem.write_to_path(str(key))
        cert.cert_chain_pems[0].write_to_path(str(chain))
        subject = x509.load_pem_x509_certificate(cert.cert_chain_pems[0].bytes()).subject
        return chain, key, subject.rfc4514_string()


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = (directory / n for n in ("ca.pem", "server.pem", "server.key"))
    ca.cert_pem.write_to_path(str(ca_file))
    server.private_key_pem.write_to_path(str(key_file))
    with open(cert_file, "wb") as f:
        for blob in server.cert_chain_pems:
            f.write(blob.bytes())
    return Certs(ca, ca_file, cert_file, key_file)
