"""A loopback stand-in for the Hugging Face hub's HTTP API, serving local folders as model
repos: the calls huggingface_hub makes to download a snapshot (repo info, the recursive file
tree, and HEAD/GET of each file under /resolve/), answered with the headers the library reads
(X-Repo-Commit, ETag, X-Linked-Etag/-Size for large files). Point the library at it with
``HF_ENDPOINT=http://127.0.0.1:PORT``. It records the paths it was asked for."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "c0ffee" + "0" * 34
#: Files from this size on are answered as LFS files (sha256 etag), as the hub does.
LFS_FROM = 10_000


def _entry(root: Path, file: Path) -> dict:
    data = file.read_bytes()
    git_oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    entry = {
        "type": "file",
        "oid": git_oid,
        "size": len(data),
        "path": file.relative_to(root).as_posix(),
    }
    if len(data) >= LFS_FROM:
        entry["lfs"] = {
            "oid": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "pointerSize": 134,
        }
    return entry


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _json(self, body: object, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _not_found(self, what: str) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound" if what == "repo" else "EntryNotFound")
        self.send_header("X-Error-Message", f"{what} not found")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        path = unquote(urlparse(self.path).path)
        self.server.requests.append(f"{self.command} {path}")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            repo = self.server.repos.get("/".join(parts[2:4]))
            if repo is None:
                return self._not_found("repo")
            files = sorted(p for p in repo.rglob("*") if p.is_file())
            if parts[4] == "revision":
                siblings = [{"rfilename": f.relative_to(repo).as_posix()} for f in files]
                return self._json({"id": "/".join(parts[2:4]), "sha": COMMIT, "siblings": siblings})
            if parts[4] == "tree":
                sub = "/".join(parts[6:])
                chosen = [f for f in files if f.relative_to(repo).as_posix().startswith(sub)]
                return self._json([_entry(repo, f) for f in chosen])
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self.server.repos.get("/".join(parts[:2]))
            if repo is None:
                return self._not_found("repo")
            file = repo / "/".join(parts[4:])
            if not file.is_file():
                return self._not_found("entry")
            entry = _entry(repo, file)
            data = file.read_bytes()
            self.send_response(200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{entry["oid"]}"')
            if "lfs" in entry:
                self.send_header("X-Linked-Etag", f'"{entry["lfs"]["oid"]}"')
                self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(data)
            return
        self._not_found("path")


class _Server(ThreadingHTTPServer):
    repos: dict[str, Path]
    requests: list[str]


@contextmanager
def hub_standin(repos: dict[str, Path]) -> Iterator[_Server]:
    """Serve ``repos`` (repo id -> local folder) on a free loopback port; ``server.url`` is
    the endpoint and ``server.requests`` the requests seen."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.repos, server.requests = dict(repos), []
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
