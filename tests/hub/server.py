"""A minimal Hub-compatible HTTP server on 127.0.0.1, for exercising `push_to_hub` end to end without a network.

It implements exactly the requests `huggingface_hub`'s upload path makes for `Trainer.push_to_hub` /
`HfApi.upload_folder` (read from huggingface_hub 2.4's `hf_api.py`, `_commit_api.py` and `lfs.py`):

- `POST /api/repos/create`: create a model repo (409 when it exists, which `create_repo(exist_ok=True)` accepts);
- `POST /api/validate-yaml`: the README front matter must be valid YAML and `base_model` a Hub repo id (the Hub
  rejects a local path there);
- `POST /api/models/{repo}/preupload/{revision}`: upload mode per file, "lfs" for the patterns of the Hub's default
  `.gitattributes` (weights, pickles), "regular" otherwise, with the stored file's oid so unchanged files are skipped;
- `POST /{repo}.git/info/lfs/objects/batch`, `PUT /lfs/{oid}`, `POST /lfs/verify`: the basic LFS transfer (the client
  must run with Xet disabled, see `tests/hub/conftest.py`: the Xet storage protocol is not simulated);
- `POST /api/models/{repo}/commit/{revision}`: the ndjson commit (`header`, inline base64 `file`, `lfsFile`);
- `GET /api/models/{repo}[/revision/{revision}]`: repo info (used when a commit would be empty).

Every request must carry the expected `Authorization: Bearer <token>`. Anything else is answered 501 (or 401/400)
and recorded in `HubServer.errors`, which the tests assert empty. The served tree of each repo lives under
`storage/<namespace>/<name>/` (the state of `main` after the last commit), so `from_pretrained` can load it.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

#: The Hub's default `.gitattributes` sends these through LFS (a subset: what a checkpoint folder can hold).
LFS_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle", "*.h5", "*.msgpack",
                "*.onnx", "*.npy", "*.npz", "*.model", "*.zip", "*.tar.gz", "*tfevents*")  # fmt: skip
REGULAR_MAX_BYTES = 10 * 1024 * 1024  # the Hub sends larger files through LFS whatever their name
MAX_BODY_BYTES = 256 * 1024 * 1024
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$")
_REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"


def git_blob_oid(content: bytes) -> str:
    """The oid `huggingface_hub` computes for a regular file (`sha.git_hash`): git's blob SHA-1."""
    return hashlib.sha1(b"blob " + str(len(content)).encode() + b"\0" + content).hexdigest()


@dataclass
class Commit:
    repo_id: str
    summary: str
    oid: str
    files: dict[str, bytes]  # path -> content, the files this commit added or changed


@dataclass
class Repo:
    repo_id: str
    private: bool | None
    commits: list[Commit] = field(default_factory=list)


class HubServer:
    """The server, its storage and what it received. Use as a context manager, or `start()` / `stop()`."""

    def __init__(self, storage: Path, token: str, max_requests: int = 2000, request_timeout_s: float = 60.0):
        self.storage = Path(storage)
        self.token = token
        self.max_requests = max_requests
        self.request_timeout_s = request_timeout_s
        self.repos: dict[str, Repo] = {}
        self.lfs_objects: dict[str, bytes] = {}  # sha256 -> content
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self.errors: list[str] = []
        self.upload_signature = secrets.token_hex(16)  # stands in for the presigned storage URL's signature
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubServer:
        server = self

        class Handler(_Handler):
            hub = server
            timeout = server.request_timeout_s  # per-socket timeout: a stuck client cannot hang the test

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # port 0: a free port
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=10)
            self._httpd = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ what the tests read
    def repo_dir(self, repo_id: str) -> Path:
        return self.storage / repo_id

    def files(self, repo_id: str) -> dict[str, bytes]:
        """path -> content of every file of `main` in `repo_id`."""
        root = self.repo_dir(repo_id)
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    def uploaded(self) -> dict[str, bytes]:
        """`repo_id/path@commit` -> content of every file any commit carried (each version of each file)."""
        return {f"{repo.repo_id}/{path}@{commit.oid[:8]}": content for repo in self.repos.values()
                for commit in repo.commits for path, content in commit.files.items()}  # fmt: skip

    def fail(self, message: str) -> None:
        with self._lock:
            self.errors.append(message)

    # ------------------------------------------------------------------ the Hub's logic
    def create_repo(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if payload.get("type", "model") != "model":
            raise NotImplementedError(f"repo type {payload.get('type')!r}")
        name, organization = payload.get("name"), payload.get("organization") or "test-user"
        repo_id = f"{organization}/{name}"
        if not isinstance(name, str) or not _REPO_ID.match(repo_id):
            return 400, {"error": f"invalid repo name {repo_id!r}"}
        with self._lock:
            if repo_id in self.repos:
                return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
            self.repos[repo_id] = Repo(repo_id, private=payload.get("visibility") == "private" or None)
        self.repo_dir(repo_id).mkdir(parents=True, exist_ok=True)
        return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id}

    def validate_yaml(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        import yaml

        content = payload.get("content", "")
        match = re.match(r"^---\s*\n(.*?)\n---\s*\n", content, re.DOTALL)
        if not match:
            return 200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata in repo card"}]}
        try:
            metadata = yaml.safe_load(match.group(1)) or {}
        except yaml.YAMLError as err:
            return 400, {"errors": [{"message": f"invalid YAML: {err}"}]}
        errors = []
        base_models = metadata.get("base_model")
        for base in [base_models] if isinstance(base_models, str) else base_models or []:
            if not isinstance(base, str) or not _REPO_ID.match(base):
                errors.append({"message": f'"base_model" must be a Hub model id, got {base!r}'})
        if metadata.get("datasets") is not None:
            datasets = metadata["datasets"]
            for name in [datasets] if isinstance(datasets, str) else datasets:
                if not isinstance(name, str) or not _REPO_ID.match(name):
                    errors.append({"message": f'"datasets" must hold Hub dataset ids, got {name!r}'})
        return (400 if errors else 200), {"errors": errors, "warnings": []}

    def _repo(self, repo_id: str) -> Repo:
        if repo_id not in self.repos:
            raise KeyError(repo_id)
        return self.repos[repo_id]

    def preupload(self, repo_id: str, revision: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self._check_revision(revision)
        self._repo(repo_id)
        files = []
        for item in payload["files"]:
            path, size = item["path"], int(item["size"])
            lfs = size > REGULAR_MAX_BYTES or any(fnmatch.fnmatch(path.rsplit("/", 1)[-1], p) for p in LFS_PATTERNS)
            stored = self.repo_dir(repo_id) / path
            oid = None
            if stored.is_file():
                content = stored.read_bytes()
                oid = hashlib.sha256(content).hexdigest() if lfs else git_blob_oid(content)
            files.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid})
        return 200, {"files": files, "commitOid": self._head(repo_id)}

    def lfs_batch(self, repo_id: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self._repo(repo_id)
        if payload.get("operation") != "upload" or "basic" not in payload.get("transfers", ["basic"]):
            raise NotImplementedError(f"LFS batch {payload.get('operation')!r} with {payload.get('transfers')}")
        objects = []
        for obj in payload["objects"]:
            oid, size = obj["oid"], int(obj["size"])
            entry: dict[str, Any] = {"oid": oid, "size": size}
            if oid not in self.lfs_objects:
                entry["actions"] = {
                    # a presigned-style URL (no Authorization header on the PUT), no chunk_size header: single-part
                    "upload": {"href": f"{self.url}/lfs/{oid}?signature={self.upload_signature}"},
                    "verify": {"href": f"{self.url}/lfs/verify"},
                }
            objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}

    def lfs_put(self, oid: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if hashlib.sha256(body).hexdigest() != oid:
            return 400, {"error": f"content does not match oid {oid}"}
        with self._lock:
            self.lfs_objects[oid] = body
        return 200, {}

    def lfs_verify(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        content = self.lfs_objects.get(payload.get("oid"))
        if content is None or len(content) != int(payload.get("size", -1)):
            return 404, {"error": f"LFS object {payload.get('oid')} not uploaded"}
        return 200, {}

    def commit(self, repo_id: str, revision: str, body: bytes) -> tuple[int, dict[str, Any]]:
        self._check_revision(revision)
        repo = self._repo(repo_id)
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            return 400, {"error": "the commit payload must start with a header line"}
        summary = lines[0]["value"]["summary"]
        files: dict[str, bytes] = {}
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            if key == "file":
                if value.get("encoding") != "base64":
                    raise NotImplementedError(f"file encoding {value.get('encoding')!r}")
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "lfsFile":
                content = self.lfs_objects.get(value["oid"])
                if content is None or value.get("algo") != "sha256":
                    return 400, {"error": f"LFS object {value['oid']} of {value['path']} was never uploaded"}
                files[value["path"]] = content
            else:  # deletions and copies: push_to_hub never sends them
                raise NotImplementedError(f"commit operation {key!r}")
        root = self.repo_dir(repo_id).resolve()
        for path, content in files.items():
            target = (root / path).resolve()
            if root not in target.parents:
                return 400, {"error": f"path outside the repo: {path!r}"}
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        oid = hashlib.sha1(f"{repo_id}:{len(repo.commits)}:{summary}".encode()).hexdigest()
        with self._lock:
            repo.commits.append(Commit(repo_id, summary, oid, files))
        return 200, {"commitUrl": f"{self.url}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None,
                     "success": True}  # fmt: skip

    def repo_info(self, repo_id: str, revision: str) -> tuple[int, dict[str, Any]]:
        self._check_revision(revision)
        repo = self._repo(repo_id)
        siblings = [{"rfilename": path} for path in self.files(repo_id)]
        return 200, {"id": repo_id, "modelId": repo_id, "sha": self._head(repo_id), "private": bool(repo.private),
                     "siblings": siblings, "tags": [], "downloads": 0, "likes": 0}  # fmt: skip

    def _head(self, repo_id: str) -> str:
        commits = self._repo(repo_id).commits
        return commits[-1].oid if commits else "0" * 40

    @staticmethod
    def _check_revision(revision: str) -> None:
        if unquote(revision) != "main":
            raise NotImplementedError(f"revision {revision!r} (only main)")


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - quiet: the tests read `hub.requests`
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks, total = [], 0
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                total += size
                if total > MAX_BODY_BYTES:
                    raise ValueError("request body too large")
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise ValueError("request body too large")
        return self.rfile.read(length)

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str) -> tuple[int, dict[str, Any]]:
        hub = self.hub
        path, query = urlsplit(self.path)[2:4]
        if len(hub.requests) >= hub.max_requests:
            raise RuntimeError(f"more than {hub.max_requests} requests")
        presigned = method == "PUT" and query == f"signature={hub.upload_signature}"
        if not presigned and self.headers.get("Authorization") != f"Bearer {hub.token}":
            return 401, {"error": "Invalid credentials in Authorization header"}
        body = self._body()

        def as_json() -> dict[str, Any]:
            return json.loads(body or b"{}")

        if method == "POST" and path == "/api/repos/create":
            return hub.create_repo(as_json())
        if method == "POST" and path == "/api/validate-yaml":
            return hub.validate_yaml(as_json())
        if method == "POST" and (m := re.fullmatch(rf"/api/models/{_REPO}/preupload/(?P<rev>[^/]+)", path)):
            return hub.preupload(m["repo"], m["rev"], as_json())
        if method == "POST" and (m := re.fullmatch(rf"/api/models/{_REPO}/commit/(?P<rev>[^/]+)", path)):
            return hub.commit(m["repo"], m["rev"], body)
        if method == "POST" and (m := re.fullmatch(rf"/{_REPO}\.git/info/lfs/objects/batch", path)):
            return hub.lfs_batch(m["repo"], as_json())
        if presigned and (m := re.fullmatch(r"/lfs/(?P<oid>[0-9a-f]{64})", path)):
            return hub.lfs_put(m["oid"], body)
        if method == "POST" and path == "/lfs/verify":
            return hub.lfs_verify(as_json())
        if method == "GET" and (m := re.fullmatch(rf"/api/models/{_REPO}(/revision/(?P<rev>[^/]+))?", path)):
            return hub.repo_info(m["repo"], m["rev"] or "main")
        raise NotImplementedError(f"{method} {path}")

    def _handle(self, method: str) -> None:
        hub = self.hub
        try:
            status, payload = self._route(method)
            if status >= 400 and status != 409:  # 409: `create_repo(exist_ok=True)` on an existing repo
                hub.fail(f"{method} {self.path}: {status} {payload}")
        except KeyError as err:
            status, payload = 404, {"error": f"Repository not found: {err}"}
            hub.fail(f"{method} {self.path}: 404 {err}")
        except NotImplementedError as err:
            status, payload = 501, {"error": f"not implemented by the test Hub: {err}"}
            hub.fail(f"{method} {self.path}: 501 {err}")
        except Exception as err:  # noqa: BLE001 - anything unexpected fails the test, loudly
            status, payload = 500, {"error": repr(err)}
            hub.fail(f"{method} {self.path}: 500 {err!r}")
        with hub._lock:
            hub.requests.append((method, urlsplit(self.path).path, status))
        self._reply(status, payload)

    def do_GET(self):  # noqa: N802
        self._handle("GET")

    def do_POST(self):  # noqa: N802
        self._handle("POST")

    def do_PUT(self):  # noqa: N802
        self._handle("PUT")

    def do_DELETE(self):  # noqa: N802
        self._handle("DELETE")

    def do_HEAD(self):  # noqa: N802
        self._handle("HEAD")
