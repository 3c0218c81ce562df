"""A stand-in for the Hugging Face Hub on 127.0.0.1: the endpoints huggingface_hub's snapshot_download uses, over
model folders on disk, with a log of the requests and connections it can be told to drop mid-file.

Served as the real Hub serves them (huggingface_hub 2.x reads these):
- GET  /api/models/{repo}/revision/{rev}: the repo's commit `sha` and `siblings`; X-Error-Code RepoNotFound for a
  repo that does not exist or that the caller may not see (HTTP 401 without a token, 404 with one, as the Hub).
- GET  /api/models/{repo}/tree/{rev}?recursive=...: the file listing: path, size, git blob `oid`, and `lfs`
  (sha256, size) for LFS files (here: *.safetensors).
- HEAD/GET /{repo}/resolve/{rev}/{file}: a regular file itself, with X-Repo-Commit, ETag (its git blob sha1) and
  Content-Length; an LFS file as a 302 to a second origin (the CDN) with X-Linked-Etag (its sha256) and
  X-Linked-Size, so huggingface_hub neither follows the redirect on HEAD nor forwards the token there; a gated
  repo's file without the token that may see it: X-Error-Code GatedRepo (HTTP 401 anonymous, 403 with a token).
- GET  {cdn}/blobs/{sha256}: LFS content, with Range (huggingface_hub resumes a dropped download with one).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS = re.compile(r"\.safetensors$")


@dataclass(frozen=True)
class HubFile:
    path: str
    data: bytes

    @property
    def lfs(self) -> bool:
        return bool(LFS.search(self.path))

    @property
    def blob_id(self) -> str:  # git's sha1 of the blob (an LFS file's is its pointer's; any stable id will do)
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class HubRepo:
    files: dict[str, HubFile]
    token: str | None = None  # private: only a caller presenting this token sees it
    gated: str | None = None  # gated: anyone sees the repo, only a caller presenting this token its files

    @property
    def commit(self) -> str:
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + b"\0" + self.files[name].blob_id.encode())
        return digest.hexdigest()


@dataclass
class HubStandin:
    """Start with `start()`; `endpoint` is what HF_ENDPOINT should be."""

    repos: dict[str, HubRepo] = field(default_factory=dict)
    log: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every request, in order
    cuts: dict[str, list[int]] = field(default_factory=dict)  # sha256 -> bytes each next GET sends before the cut

    def add(self, repo_id: str, folder: Path, token: str | None = None, gated: str | None = None,
            extra: dict[str, bytes] | None = None) -> HubRepo:
        """Serves `folder`'s files (and `extra` files, by their repo paths) as `repo_id`."""
        files = {p.name: HubFile(p.name, p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()}
        files.update({name: HubFile(name, data) for name, data in (extra or {}).items()})
        self.repos[repo_id] = HubRepo(files, token, gated)
        return self.repos[repo_id]

    def cut(self, repo_id: str, path: str, sends: list[int]) -> None:
        """The next len(sends) downloads of that file send sends[i] bytes, then drop the connection."""
        self.cuts[self.repos[repo_id].files[path].sha256] = list(sends)

    def requests(self, method: str, fragment: str = "") -> list[str]:
        return [path for m, path in list(self.log) if m == method and fragment in path]

    def start(self) -> HubStandin:
        self._hub = _serve(self, cdn=False)
        self._cdn = _serve(self, cdn=True)
        return self

    def stop(self) -> None:
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def blob(self, sha256: str) -> HubFile | None:
        for repo in self.repos.values():
            for f in repo.files.values():
                if f.sha256 == sha256:
                    return f
        return None


def _serve(hub: HubStandin, cdn: bool) -> ThreadingHTTPServer:
    class Handler(_Handler):
        standin, is_cdn = hub, cdn

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/(?P<kind>revision|tree)/(?P<rev>[^/?]+)")
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    standin: HubStandin
    is_cdn: bool

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def _route(self, body: bool) -> None:
        path = unquote(urlparse(self.path).path)
        self.standin.log.append((self.command, ("cdn:" if self.is_cdn else "") + path))
        if self.is_cdn:
            blob = self.standin.blob(path.rsplit("/", 1)[-1]) if path.startswith("/blobs/") else None
            return self._content(blob.data, {}, body, blob.sha256) if blob else self._status(404, {})
        if match := API.match(path):
            repo = self._repo(match["repo"])
            if repo is None:
                return None
            if match["kind"] == "revision":
                return self._json({"id": match["repo"], "sha": repo.commit,
                                   "siblings": [{"rfilename": name} for name in repo.files]})
            return self._json([_tree_entry(f) for f in repo.files.values()])
        if match := RESOLVE.match(path):
            repo = self._repo(match["repo"])
            if repo is None:
                return None
            if repo.gated is not None and self._token() != repo.gated:  # 401 to an anonymous caller, else 403
                return self._status(403 if self._token() else 401, {"X-Error-Code": "GatedRepo"})
            f = repo.files.get(match["file"])
            if f is None:
                return self._status(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit})
            headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{f.blob_id}"'}
            if f.lfs:
                return self._status(302, {**headers, "Location": f"{self.standin.cdn}/blobs/{f.sha256}",
                                          "X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(len(f.data))})
            return self._content(f.data, headers, body, None)
        return self._status(404, {})

    def _repo(self, repo_id: str) -> HubRepo | None:
        repo = self.standin.repos.get(repo_id)
        token = self._token()
        if repo is None or (repo.token is not None and token != repo.token):
            # what the Hub answers for a missing or private repo: 401 to an anonymous caller, 404 to a token
            self._status(404 if token else 401, {"X-Error-Code": "RepoNotFound",
                                                 "X-Error-Message": "Repository not found"})
            return None
        return repo

    def _token(self) -> str:
        return (self.headers.get("authorization") or "").removeprefix("Bearer ")

    def _json(self, payload: object) -> None:
        data = json.dumps(payload).encode()
        self._content(data, {"Content-Type": "application/json"}, True, None)

    def _status(self, code: int, headers: dict[str, str]) -> None:
        self.send_response(code)
        for key, value in {**headers, "Content-Length": "0"}.items():
            self.send_header(key, value)
        self.end_headers()

    def _content(self, data: bytes, headers: dict[str, str], body: bool, sha256: str | None) -> None:
        start = 0
        if body and (ranged := re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))):
            start = int(ranged[1])
        self.send_response(206 if start else 200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return
        cuts = self.standin.cuts.get(sha256 or "")
        if cuts:
            self.wfile.write(data[start:start + cuts.pop(0)])
            self.wfile.flush()
            self.close_connection = True  # the rest never comes: the client sees a short body
            return
        self.wfile.write(data[start:])


def _tree_entry(f: HubFile) -> dict:
    entry = {"type": "file", "oid": f.blob_id, "size": len(f.data), "path": f.path}
    if f.lfs:
        entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
    return entry
