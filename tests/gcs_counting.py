"""A request-counting layer in front of the GCS emulator: what a run would be billed for.

`counting(emulator)` starts a loopback HTTP proxy that relays every JSON-API request to the
emulator and points STORAGE_EMULATOR_HOST at itself, so google-cloud-storage clients made
from then on (in this process and in the processes it starts) go through it. It counts
requests by kind (`kind_of`) and the body bytes downloaded and uploaded:

    with counting(gcs) as counter:
        run_the_build()
    counter.totals()   # {"media_get": 300, "list": 2, ..., "bytes_down": ..., "bytes_up": ...}

Clients keep their connections: the proxy answers HTTP/1.1 with a Content-Length and keeps
the client's connection open, while each request goes to the emulator (HTTP/1.0, one
connection per request) on its own. Tests and benchmarks/bench_gcs_cost.py share it.
"""

import collections
import contextlib
import os
import socket
import socketserver
import threading
import urllib.parse

import pytest

from tests.gcs_emulator import _header, _read_head, read_body

KINDS = ("list", "metadata_get", "media_get", "bucket_get", "upload", "copy", "delete",
         "batch", "compose", "patch", "other")


def kind_of(method, target):
    """An HTTP request to the JSON API -> the kind of storage operation it bills as."""
    path, _, query = target.partition("?")
    params = urllib.parse.parse_qs(query)
    parts = [urllib.parse.unquote(p) for p in path.split("/") if p]
    if parts[:1] == ["batch"]:
        return "batch"
    if parts[:1] == ["upload"]:
        return "upload"
    if parts[:1] == ["download"]:
        return "media_get"
    if parts[:2] != ["storage", "v1"] or len(parts) < 4 or parts[2] != "b":
        return "other"
    rest = parts[4:]
    if method == "DELETE":
        return "delete"
    if len(parts) == 4:  # /storage/v1/b/BUCKET
        return "bucket_get" if method == "GET" else "other"
    if rest == ["o"]:
        return "list" if method == "GET" else "upload"
    if "rewriteTo" in rest or "copyTo" in rest:
        return "copy"
    if rest[-1:] == ["compose"]:
        return "compose"
    if method == "GET":
        return "media_get" if params.get("alt") == ["media"] else "metadata_get"
    if method in ("PATCH", "PUT"):
        return "patch"
    return "other"


class Counter:
    """Counts of one proxy, thread-safe; `totals()` is a plain dict."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts = collections.Counter()
        self.log = []  # (kind, method, target, bytes down) of every request, in order

    def add(self, kind, method, target, down, up):
        with self._lock:
            self._counts[kind] += 1
            self._counts["requests"] += 1
            self._counts["bytes_down"] += down
            self._counts["bytes_up"] += up
            if kind == "media_get":
                self._counts["media_bytes"] += down
            self.log.append((kind, method, target, down))

    def totals(self):
        with self._lock:
            return dict(self._counts)

    def reset(self):
        with self._lock:
            self._counts.clear()
            self.log.clear()

    def __getitem__(self, kind):
        with self._lock:
            return self._counts[kind]


class CountingProxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, emulator_endpoint):
        host, _, port = emulator_endpoint.rpartition("//")[2].partition(":")
        self.upstream = (host, int(port))
        self.counter = Counter()
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        sock, rest = self.request, b""
        sock.settimeout(300)
        while True:  # one client connection, many requests (keep-alive)
            try:
                head, rest = _read_head(sock, rest)
            except OSError:
                return
            if head is None:
                return
            body = read_body(sock, head, rest)
            if body is None:
                return
            length = int(_header(head, b"content-length") or 0)
            rest = body[length:] if length else b""
            body = body[:length] if length else body
            if not self._relay(sock, head, body):
                return

    def _relay(self, sock, head, body):
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        method, target = request_line.split(" ")[:2]
        lines = [l for l in head.split(b"\r\n")[:-2] if l.split(b":")[0].strip().lower()
                 not in (b"transfer-encoding", b"content-length", b"expect", b"connection")]
        upstream_head = b"\r\n".join(lines + [b"Content-Length: %d" % len(body),
                                              b"Connection: close", b"", b""])
        with socket.create_connection(self.server.upstream, timeout=300) as up:
            up.sendall(upstream_head + body)
            answer = b""
            while chunk := up.recv(1 << 20):
                answer += chunk
        answer_head, _, answer_body = answer.partition(b"\r\n\r\n")
        status, *header_lines = answer_head.split(b"\r\n")
        header_lines = [l for l in header_lines if l.split(b":")[0].strip().lower()
                        not in (b"content-length", b"connection", b"transfer-encoding")]
        status = status.replace(b"HTTP/1.0", b"HTTP/1.1", 1)
        out = b"\r\n".join([status, *header_lines,
                            b"Content-Length: %d" % len(answer_body),
                            b"Connection: keep-alive", b"", b""])
        self.server.counter.add(kind_of(method, target), method, target,
                                len(answer_body), len(body))
        try:
            sock.sendall(out + answer_body)
        except OSError:
            return False
        return True


@contextlib.contextmanager
def counting(emulator):
    """Send every storage client made from now on through a CountingProxy in front of
    `emulator` (a tests.gcs_emulator.GcsEmulator); yields its Counter."""
    proxy = CountingProxy(emulator.endpoint)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = proxy.endpoint
    try:
        yield proxy.counter
    finally:
        if before is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = before
        proxy.shutdown()
        proxy.server_close()


@pytest.fixture
def gcs_counter(gcs):
    """A Counter of every storage request this test makes (through `counting`)."""
    with counting(gcs) as counter:
        yield counter
