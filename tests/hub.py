"""A small Hugging Face Hub on 127.0.0.1, for the tests of models by name (engine.hub).

It answers what huggingface_hub calls for a model repository: the revision's
info (`/api/models/{repo}[/revision/{rev}]`, its siblings with sizes and LFS
sizes), and file resolution (`/{repo}/resolve/{rev}/{path}`, HEAD and GET) with
the ETag and X-Repo-Commit headers and Range requests. A repository can be
gated (401 with the GatedRepo error code unless the right bearer token comes),
and a file can be cut: its first GET sends half its bytes and drops the
connection, later ones drop it at once, until `cut` is cleared. `requests`
records (method, path, Range header) of every call.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class Repo:
    files: dict[str, bytes]
    sha: str = "a" * 40
    gated_token: str | None = None  # set: 401 unless `Bearer <token>` comes
    denied: str = "GatedRepo"  # the X-Error-Code of that 401 ("": none, as for a private one)


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    cut: set[str] = field(default_factory=set)  # "repo/path" of files whose GETs break
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    url: str = ""

    def add_dir(self, repo: str, directory: Path, sha: str = "a" * 40, **kw) -> Repo:
        files = {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()}
        self.repos[repo] = Repo(files, sha, **kw)
        return self.repos[repo]


def _commit(repo: Repo, rev: str) -> bool:
    return rev in ("main", repo.sha)


def _handler(hub: Hub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, body: bytes = b"", headers: dict | None = None):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, code: int, error_code: str):
            body = json.dumps({"error": error_code or "denied"}).encode()
            headers = {"Content-Type": "application/json"}
            if error_code:
                headers["X-Error-Code"] = error_code
            self._send(code, body, headers)

        def _repo(self, repo_id: str) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound")
                return None
            if (
                repo.gated_token
                and self.headers.get("Authorization") != f"Bearer {repo.gated_token}"
            ):
                self._error(401, repo.denied)
                return None
            return repo

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            path = unquote(urlparse(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Range", "")))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"]:
                return self._info(parts[2:])
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._file("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
            self._error(404, "EntryNotFound")

        def _info(self, parts):
            repo_id = "/".join(parts[:2])
            repo = self._repo(repo_id)
            if repo is None:
                return
            if len(parts) >= 4 and not _commit(repo, parts[3]):
                return self._error(404, "RevisionNotFound")
            siblings = []
            for name, data in repo.files.items():
                sibling = {"rfilename": name, "size": len(data)}
                if name.endswith((".safetensors", ".bin")):
                    digest = hashlib.sha256(data).hexdigest()
                    sibling["lfs"] = {"size": len(data), "sha256": digest, "pointerSize": 134}
                siblings.append(sibling)
            body = {"id": repo_id, "modelId": repo_id, "sha": repo.sha, "siblings": siblings}
            self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

        def _file(self, repo_id: str, rev: str, name: str):
            repo = self._repo(repo_id)
            if repo is None:
                return
            if not _commit(repo, rev):
                return self._error(404, "RevisionNotFound")
            data = repo.files.get(name)
            if data is None:
                return self._error(404, "EntryNotFound")
            headers = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": repo.sha}
            start = 0
            wanted = self.headers.get("Range", "")
            if wanted.startswith("bytes=") and self.command == "GET":
                start = int(wanted[6:].split("-")[0] or 0)
            if self.command == "GET" and f"{repo_id}/{name}" in hub.cut:
                return self._cut(data, start, headers)
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                return self._send(206, data[start:], headers)
            self._send(200, data, headers)

        def _cut(self, data: bytes, start: int, headers: dict):
            """Half the file on the first GET, nothing on the next ones; then the drop."""
            self.send_response(206 if start else 200)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            if start == 0:
                self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)

    return Handler


def start_hub(hub: Hub) -> tuple[ThreadingHTTPServer, Hub]:
    """Serve `hub` on a free port of 127.0.0.1 from a daemon thread; its `url` set."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, hub
