"""A recording HTTP proxy between a coding agent and the bridge, for the agent tests.

It forwards every request to the bridge as it came and streams the answer back,
chunk by chunk (SSE stays SSE), and records each exchange: method, path, status,
the JSON body sent, and the response's `usage` where one came back (the last
`usage` object of a stream). The agent tests read the records to check that
every request was answered and how much of the second run's prompts the cache
restored, and save the bodies as wire-shape fixtures. Standard library only; it
knows HTTP and JSON, nothing of the wire formats beyond where usage sits.
"""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass
class Exchange:
    method: str
    path: str
    body: dict | None
    status: int = 0
    usage: dict | None = None
    headers: dict = field(default_factory=dict)


def _last_usage(text: str) -> dict | None:
    """The last `usage` object in a JSON body or an SSE stream (None: none)."""
    found = None
    chunks = [text] if not text.lstrip().startswith(("event:", "data:")) else []
    chunks += [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    for chunk in chunks:
        try:
            data = json.loads(chunk)
        except ValueError:
            continue
        for holder in (data, data.get("response"), data.get("message")):
            if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
                found = holder["usage"]
    return found


class Recorder:
    """`Recorder(upstream_port)`: listens on `.port`, forwards to 127.0.0.1:upstream_port."""

    def __init__(self, upstream_port: int):
        self.exchanges: list[Exchange] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                ex = Exchange(self.command, self.path, body)
                recorder.exchanges.append(ex)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=600)
                conn.request(self.command, self.path, raw or None, headers)
                resp = conn.getresponse()
                ex.status = resp.status
                ex.headers = {k.lower(): v for k, v in resp.getheaders()}
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                seen = []
                while chunk := resp.read1(65536):
                    seen.append(chunk)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                conn.close()
                ex.usage = _last_usage(b"".join(seen).decode("utf-8", "replace"))

            do_GET = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
