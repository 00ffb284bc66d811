"""The participant client's HTTPS: a certificate is verified against the system's CA store (``SSL_CERT_FILE``),
and one the system does not trust is refused.

A real HTTPS server on loopback, its certificate signed by a CA made here; the client runs in a process of
its own, whose default CA file (``SSL_CERT_FILE``) is that CA or the system's.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

#: The client: aiohttp as aml-ray's participant client imports it, one plain HTTP and one HTTPS request;
#: prints what it saw as JSON.
CLIENT = """
import asyncio, json, sys
import aml_ray.actors.participant
import aiohttp
seen = {}

async def get(url):
    async with aiohttp.ClientSession() as session:
        try:
            async with session.get(url) as resp:
                return resp.status
        except aiohttp.ClientConnectorCertificateError as exc:
            return "certificate: " + str(exc.certificate_error.verify_message)

async def main():
    seen["http"] = await get(sys.argv[1])
    seen["https"] = await get(sys.argv[2])

asyncio.run(main())
print(json.dumps(seen))
"""


def _certificates(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 signed by it: (ca.pem, server.pem, server.key)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aml-ray test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def servers(tmp_path):
    """A plain HTTP and an HTTPS server on loopback: (http URL, https URL, the CA file)."""
    ca, cert, key = _certificates(tmp_path)
    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    tls = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    tls.socket = context.wrap_socket(tls.socket, server_side=True)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (plain, tls)]
    for t in threads:
        t.start()
    yield f"http://127.0.0.1:{plain.server_address[1]}/", f"https://127.0.0.1:{tls.server_address[1]}/", ca
    for s in (plain, tls):
        s.shutdown()
        s.server_close()


def _client(http_url: str, https_url: str, ca_file: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    if ca_file is not None:
        env["SSL_CERT_FILE"] = str(ca_file)
    out = subprocess.run([sys.executable, "-c", CLIENT, http_url, https_url], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_https_verifies_against_the_systems_ca_store(servers):
    http_url, https_url, ca = servers
    assert _client(http_url, https_url, ca) == {"http": 200, "https": 200}


def test_https_refuses_a_certificate_the_system_does_not_trust(servers):
    http_url, https_url, _ = servers
    seen = _client(http_url, https_url, None)
    assert seen["http"] == 200 and seen["https"] == "certificate: unable to get local issuer certificate"
