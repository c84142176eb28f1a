"""The admin HTTP port with a bearer token and over TLS (issue 13)."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

import pytest

from onceflow.broker.embedded import Broker
from tests.security.certs import make_certs

pytestmark = pytest.mark.timeout(60)

TOKEN = "s3cret-admin-token"


def _get(url: str, token: str | None = None, context: ssl.SSLContext | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url + "/faults", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_token_and_tls(tmp_path, caplog):
    certs = make_certs(tmp_path / "certs")
    broker = Broker(tmp_path / "data", admin_port=0, admin_token=TOKEN, admin_tls=True,
                    ssl_certfile=certs.cert_file, ssl_keyfile=certs.key_file)
    with broker:
        url = broker.admin_url
        assert url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(certs.ca_file))
        assert _get(url, TOKEN, context) == 200
        assert _get(url, None, context) == 401
        assert _get(url, TOKEN + "x", context) == 401
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # HTTP to HTTPS port
            _get(url.replace("https", "http"), TOKEN)
    assert TOKEN not in caplog.text


def test_no_token_configured_stays_open(tmp_path):
    with Broker(tmp_path / "data", admin_port=0) as broker:
        assert broker.admin_url.startswith("http://127.0.0.1:")
        assert _get(broker.admin_url) == 200


def test_cli_sends_the_token_from_the_environment(tmp_path):
    import os
    import subprocess
    import sys

    with Broker(tmp_path / "data", admin_port=0, admin_token=TOKEN) as broker:
        command = [sys.executable, "-m", "onceflow", "faults", "list", "--admin", broker.admin_url]
        env = dict(os.environ, ONCEFLOW_ADMIN_TOKEN=TOKEN)
        assert subprocess.run(command, env=env, capture_output=True, timeout=60).returncode == 0
        env.pop("ONCEFLOW_ADMIN_TOKEN")
        refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "bearer token" in refused.stderr
