"""Fixtures of the push tests: a local Hub server (`tests/hub/server.py`) that `huggingface_hub` talks to.

`hub` (module scope) starts the server on 127.0.0.1 (a free port, a temporary storage directory), points
`HF_ENDPOINT` and a fake `HF_TOKEN` at it and lifts the test-wide offline mode for the module, then restores
everything and stops the server. While it runs, any connection or name lookup to a host other than the loopback
interface raises (and is recorded), so no request can leave the machine.
"""

from __future__ import annotations

import os
import socket

import pytest

from tests.hub.server import HubServer

#: Shaped like a real user access token (`hf_` + 34 characters), so any check for token-shaped strings sees it.
FAKE_TOKEN = "hf_" + "FaKeHuBtOkEn" * 2 + "0123456789"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _guard_network(mp: pytest.MonkeyPatch, hub: HubServer) -> None:
    """Refuse every connection and DNS lookup that is not for the loopback interface."""
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def connect(sock, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in LOOPBACK and not host.startswith("/"):
            hub.fail(f"connection to {address!r} refused: no request may leave the machine")
            raise ConnectionRefusedError(f"test Hub: connection to {address!r} refused")
        return real_connect(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        if host not in LOOPBACK and host is not None:
            hub.fail(f"DNS lookup of {host!r} refused: no request may leave the machine")
            raise socket.gaierror(f"test Hub: lookup of {host!r} refused")
        return real_getaddrinfo(host, *args, **kwargs)

    mp.setattr(socket.socket, "connect", connect)
    mp.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A running `HubServer` with `huggingface_hub` (and transformers' shared `HfApi`) pointed at it."""
    import huggingface_hub
    import huggingface_hub.constants as constants
    import transformers.utils.hub as transformers_hub

    server = HubServer(tmp_path_factory.mktemp("hub-storage"), token=FAKE_TOKEN)
    offline_before = os.environ.get("HF_HUB_OFFLINE"), constants.HF_HUB_OFFLINE
    with server, pytest.MonkeyPatch.context() as mp:
        url = server.url
        _guard_network(mp, server)
        # huggingface_hub reads these at import time into `constants`, and builds its module-level `HfApi` then:
        # patch the environment for subprocesses and the constants / cached clients for this process.
        for name, value in {"HF_ENDPOINT": url, "HF_TOKEN": FAKE_TOKEN, "HF_HUB_DISABLE_XET": "1",
                            "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "127.0.0.1,localhost"}.items():  # fmt: skip
            mp.setenv(name, value)
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
            mp.delenv(name, raising=False)
        mp.setattr(constants, "ENDPOINT", url)
        mp.setattr(constants, "HF_HUB_OFFLINE", False)
        mp.setattr(constants, "HF_HUB_DISABLE_XET", True)  # the Xet storage protocol is not simulated: plain LFS
        mp.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        mp.setattr(huggingface_hub.hf_api.api, "endpoint", url)
        mp.setattr(transformers_hub, "_hf_api", None)  # transformers caches one HfApi (built with the endpoint)
        yield server
    assert (os.environ.get("HF_HUB_OFFLINE"), constants.HF_HUB_OFFLINE) == offline_before  # offline mode is back
    assert not server.errors, server.errors
