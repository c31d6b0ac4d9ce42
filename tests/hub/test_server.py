"""The local Hub server itself: what `huggingface_hub` uploads arrives intact, and anything else fails loudly."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import pytest

from tests.hub.conftest import FAKE_TOKEN
from tests.hub.server import HubServer


def _request(url: str, method: str = "GET", token: str | None = FAKE_TOKEN, body: dict | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_unimplemented_or_unauthenticated_requests_fail_loudly(tmp_path):
    with HubServer(tmp_path, token=FAKE_TOKEN) as server:
        assert _request(f"{server.url}/api/whoami-v2") == 501
        assert _request(f"{server.url}/api/repos/create", "POST", token=None, body={"name": "x"}) == 401
        assert _request(f"{server.url}/api/models/a/b/preupload/main", "POST", body={"files": []}) == 404
        assert _request(f"{server.url}/api/repos/create", "POST", body={"name": "x", "type": "space"}) == 501
    assert len(server.errors) == 4, server.errors
    assert "501" in server.errors[0] and "401" in server.errors[1] and "404" in server.errors[2]


def test_upload_folder_round_trip(hub, tmp_path):
    """Regular files inline, weights through LFS, unchanged files skipped, a local `base_model` rejected."""
    from huggingface_hub import HfApi

    folder = tmp_path / "repo"
    (folder / "sub").mkdir(parents=True)
    (folder / "README.md").write_text("---\nlibrary_name: transformers\n---\n# card\n")
    (folder / "model.safetensors").write_bytes(os.urandom(5000))
    (folder / "sub" / "notes.txt").write_text("notes")
    api = HfApi()
    assert api.create_repo("test-user/round-trip", exist_ok=True).repo_id == "test-user/round-trip"
    api.create_repo("test-user/round-trip", exist_ok=True)  # 409 from the server, accepted by exist_ok
    api.upload_folder(repo_id="test-user/round-trip", folder_path=folder)
    stored = hub.files("test-user/round-trip")
    assert stored == {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert any(m == "PUT" and p.startswith("/lfs/") and code == 200 for m, p, code in hub.requests)  # LFS weights
    api.upload_folder(repo_id="test-user/round-trip", folder_path=folder)  # nothing changed: no second commit
    assert len(hub.repos["test-user/round-trip"].commits) == 1

    (folder / "README.md").write_text(f"---\nbase_model: {tmp_path}\n---\n# card\n")
    with pytest.raises(ValueError, match="base_model"):
        api.upload_folder(repo_id="test-user/round-trip", folder_path=folder)
    assert hub.errors and "base_model" in hub.errors[-1]
    hub.errors.clear()  # expected: the module's teardown asserts there is no other error
