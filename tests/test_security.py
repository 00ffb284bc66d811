"""Key hashing, SecretBox rotation and the endpoint (SSRF) validator: one test per rejection class."""

from __future__ import annotations

import doctest
import http.server
import threading

import pytest
from cryptography.fernet import Fernet, InvalidToken

import aml_ray.security as security
from aml_ray.security import (
    EndpointRejected,
    SecretBox,
    check_health,
    hash_key,
    new_key,
    validate_endpoint_url,
    verify_key,
)


def fake_resolver(table: dict[str, list[str]]):
    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError("NXDOMAIN")
        return table[host]
    return resolve


PUBLIC = fake_resolver({"memory.example.com": ["93.184.215.14"],
                        "private.example.com": ["10.1.2.3"],
                        "mixed.example.com": ["93.184.215.14", "192.168.1.5"],
                        "localhost": ["127.0.0.1", "::1"]})


def test_new_key_is_prefixed_random_and_verifies_against_its_hash():
    a, b = new_key(), new_key()
    assert a.startswith("aml_") and len(a) == 4 + 43 and a != b
    stored = hash_key(a)
    assert len(stored) == 64 and a not in stored
    assert verify_key(a, stored) and not verify_key(b, stored)


def test_secretbox_roundtrip_and_ciphertext_hides_plaintext():
    box = SecretBox([Fernet.generate_key().decode()])
    token = box.encrypt("msk-plaintext-123")
    assert "msk-plaintext-123" not in token
    assert box.decrypt(token).get_secret_value() == "msk-plaintext-123"
    assert "msk-plaintext-123" not in repr(box.decrypt(token))


def test_secretbox_rotation_moves_tokens_to_the_new_key():
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    token = SecretBox([old]).encrypt("s3cret")
    rotating = SecretBox([new, old])
    rotated = rotating.rotate(token)
    assert SecretBox([new]).decrypt(rotated).get_secret_value() == "s3cret"
    with pytest.raises(InvalidToken):
        SecretBox([new]).decrypt(token)


def test_secretbox_from_env_rejects_missing_and_invalid_keys_without_echoing_them():
    with pytest.raises(ValueError, match="AML_MASTER_KEYS"):
        SecretBox.from_env({})
    with pytest.raises(ValueError, match="#1 is not a valid Fernet key") as info:
        SecretBox.from_env({"AML_MASTER_KEYS": "not-a-key-xyz"})
    assert "not-a-key-xyz" not in str(info.value)
    box = SecretBox.from_env({"AML_MASTER_KEYS": f"{Fernet.generate_key().decode()}, "
                                                 f"{Fernet.generate_key().decode()}"})
    assert box.decrypt(box.encrypt("x")).get_secret_value() == "x"


@pytest.mark.parametrize("url, reason", [
    ("ftp://memory.example.com/add", "scheme must be http or https"),
    ("file:///etc/passwd", "scheme must be http or https"),
    ("http://user:pw@memory.example.com/", "credentials in the URL"),
    ("http://user@memory.example.com/", "credentials in the URL"),
    ("http:///add", "no host"),
    ("http://127.0.0.1/add", "loopback"),
    ("http://127.9.9.9:8080/add", "loopback"),
    ("http://localhost:8000/add", "loopback"),
    ("http://10.0.0.1/", "private"),
    ("http://172.16.0.1/", "private"),
    ("http://172.31.255.254/", "private"),
    ("http://192.168.0.1/", "private"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[::1]/", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "IPv4-mapped"),
    ("http://[::ffff:93.184.215.14]/", "IPv4-mapped"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://[::]/", "unspecified"),
    ("http://224.0.0.1/", "multicast"),
    ("http://240.0.0.1/", "reserved"),
    ("http://[fe80::1]/", "link-local"),
    ("http://[fc00::1]/", "private"),
    ("http://100.64.0.1/", "non-global"),
    ("http://2130706433/", "non-canonical numeric"),
    ("http://0177.0.0.1/", "non-canonical numeric"),
    ("http://0x7f.0.0.1/", "non-canonical numeric"),
    ("http://127.1/", "non-canonical numeric"),
    ("http://private.example.com/add", "10.1.2.3 (private address)"),
    ("http://mixed.example.com/add", "192.168.1.5 (private address)"),
    ("http://nxdomain.example.com/", "does not resolve"),
    ("http://memory.example.com:99999/", "not a valid URL"),
])
def test_validator_rejects(url, reason):
    with pytest.raises(EndpointRejected) as info:
        validate_endpoint_url(url, resolver=PUBLIC)
    assert reason in info.value.reason
    assert "pw@" not in str(info.value)


def test_validator_pins_the_checked_public_address():
    pinned = validate_endpoint_url("https://memory.example.com/v1/add?x=1", resolver=PUBLIC)
    assert (pinned.scheme, pinned.host, pinned.port, pinned.address) == \
        ("https", "memory.example.com", 443, "93.184.215.14")
    kwargs = pinned.request_kwargs()
    assert kwargs["url"] == "https://93.184.215.14:443/v1/add?x=1"
    assert kwargs["headers"] == {"Host": "memory.example.com"}
    assert kwargs["extensions"] == {"sni_hostname": "memory.example.com"}


def test_allow_loopback_admits_loopback_only():
    pinned = validate_endpoint_url("http://localhost:8123/add", allow_loopback=True, resolver=PUBLIC)
    assert pinned.addresses == ("127.0.0.1", "::1") and pinned.address == "127.0.0.1"
    assert validate_endpoint_url("http://[::1]:9/", allow_loopback=True).address == "::1"
    for url in ("http://10.0.0.1/", "http://169.254.169.254/", "http://[::ffff:127.0.0.1]/"):
        with pytest.raises(EndpointRejected):
            validate_endpoint_url(url, allow_loopback=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        if self.path == "/health":
            self.send_response(200)
        else:
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_check_health_goes_to_pinned_address_and_never_follows_redirects():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        resolve = fake_resolver({"svc.test": ["127.0.0.1"]})
        ok = validate_endpoint_url(f"http://svc.test:{port}/health", allow_loopback=True, resolver=resolve)
        assert check_health(ok) == (True, "HTTP 200")
        redirect = validate_endpoint_url(f"http://127.0.0.1:{port}/moved", allow_loopback=True)
        assert check_health(redirect) == (False, "HTTP 302")
    finally:
        server.shutdown()
        server.server_close()


def test_security_doctests():
    result = doctest.testmod(security, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 3


def test_check_health_ends_at_its_deadline_against_a_server_that_sends_one_byte_a_second():
    """The server's next byte always comes within a per-read timeout; the check ends at its 2 s deadline."""
    from tests.test_service_admission import Trickle

    server = Trickle()
    answer: list[tuple[bool, str]] = []
    try:
        endpoint = validate_endpoint_url(f"{server.base_url}/health", allow_loopback=True)
        worker = threading.Thread(target=lambda: answer.append(check_health(endpoint, timeout_s=2.0)), daemon=True)
        worker.start()
        worker.join(20)  # a per-read timeout never fires: without a deadline the check lasts until the server stops
        assert answer == [(False, "TimeoutError")]
    finally:
        server.release()
