"""A fault-injecting HTTP proxy in front of the GCS emulator.

    with FaultProxy(gcs.endpoint, rate=0.05, seed=13) as proxy:   # gcs: the emulator fixture
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)   # children inherit it
        ...                      # proxy.injected == {"503": 4, "429": 3, "drop": 2, ...}

Every JSON-API request (google-cloud-storage, and so Beam's gcsio) then goes through it:

* Faults: each request, in arrival order, draws from one seeded random stream; with
  probability `rate` it gets one of FAULTS instead of its answer: a 503 or a 429, the
  connection reset before the request reaches the emulator (`drop`), or reset after the
  emulator has carried it out and before its answer is sent (`drop_after`: the client must
  retry a request that already took effect, the nasty case for non-idempotent writes).
* Generation preconditions, which gcp-storage-emulator ignores (its source has no
  ifGenerationMatch anywhere): a request carrying `ifGenerationMatch` / `ifGenerationNotMatch`
  is checked against the object's current generation and answered 412 when it does not hold,
  atomically with its execution (one such request at a time, across every proxy of the
  process). Covered: single-request
  uploads (media, multipart), downloads, metadata reads, deletes, copies and rewrites (the
  destination). Reads of a `generation` that is no longer live are answered 404, as GCS
  answers them in a bucket without object versioning (the emulator keeps one generation
  and ignores the parameter). Not covered: a precondition on a resumable upload is checked when the
  upload starts, not when its last chunk lands, and requests inside a batch are not checked.
* Forced answers (`proxy.fail(text, status, times)`): a request whose decoded target
  contains `text` is answered `status` (e.g. 403, or 503 a few times), before any drawn fault;
  status "timeout" answers nothing for STALL seconds (the client's read times out), then
  resets the connection.
* Held uploads (`proxy.hold(pattern, barrier)`): the first upload whose target or metadata
  matches `pattern` waits at `barrier` (shared with other proxies) before it is forwarded,
  so the attempts behind several proxies are all inside that upload at one moment; `held`
  records when it arrived and was let go.
* Finished resumable uploads: GCS answers a later request to a completed upload session
  with the object (that is how a client whose final answer was lost learns the upload is
  done); the emulator has forgotten the session and says 404, so the proxy answers instead.

Faults are drawn in arrival order from a fixed seed: the rate and the sequence are fixed,
but with requests in flight from several threads, which request meets which fault varies.
"""

import json
import random
import re
import socket
import socketserver
import struct
import threading
import time
import urllib.parse

from tests.gcs_emulator import _header, _read_head, read_body

FAULTS = ("503", "429", "drop", "drop_after")
STALL = 5.0  # seconds a "timeout" answer keeps the client waiting before the reset
# One for every proxy in this process: two proxies in front of one emulator (two workers'
# storage paths) must not both see "absent" and both write (as GCS never lets them).
_CAS_LOCK = threading.Lock()
_OBJECT = re.compile(r".*/b/([^/]+)/o/(.+)$")  # the last /b/B/o/NAME: a copy's destination


class FaultProxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, emulator_endpoint, rate=0.0, seed=0, faults=FAULTS):
        host, _, port = emulator_endpoint.rpartition("//")[2].partition(":")
        self.upstream = (host, int(port))
        self.rate, self.faults = rate, tuple(faults)
        self.random = random.Random(seed)
        self.draw_lock = threading.Lock()      # one random stream, drawn in arrival order
        self.cas_lock = _CAS_LOCK              # precondition check + execution, atomically
        self.requests, self.injected, self.refused_412 = 0, {f: 0 for f in faults}, 0
        self.log = []                          # (fault, method, path) of each injected fault
        self.finished_uploads = {}             # upload_id -> the answer that completed it
        self.forced = []                       # [text, status, times left (None: always)]
        self.forced_hits = []                  # (status, decoded target) of each forced answer
        self.holds, self.held = [], []         # [pattern, barrier]; (arrived, released, target)
        super().__init__(("127.0.0.1", 0), _Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def address(self):
        return self.server_address[:2]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()

    def draw(self, method, path):
        """The fault for the next request, or None."""
        with self.draw_lock:
            self.requests += 1
            if self.rate and self.random.random() < self.rate:
                fault = self.random.choice(self.faults)
                self.injected[fault] += 1
                self.log.append((fault, method, path))
                return fault
        return None

    def fail(self, text, status, times=None, method=None, after=0):
        """Answer `status` to requests whose decoded target contains `text` (`times` times,
        or always); with `method`, only requests of that method, including the requests
        inside a batch (the whole batch is answered `status`, as a refused batch would be
        by the client); with `after`, only once that many of them were let through (a
        fault midway through a file read by ranges). `fail_clear()` forgets them all (and
        the holds)."""
        self.forced.append([text, status, times, method, after])

    def fail_clear(self):
        self.forced, self.holds, self.held, self.forced_hits = [], [], [], []

    def hold(self, pattern, barrier):
        """Hold the first upload (a request to /upload/) whose decoded target or body
        matches the regex `pattern` at `barrier` (a threading.Barrier with a timeout); a
        broken barrier lets it through and is recorded as released None."""
        self.holds.append([re.compile(pattern), barrier])

    def wait_if_held(self, target, body):
        if "/upload/" not in target or not self.holds:
            return
        text = urllib.parse.unquote(target) + "\n" + body[:65536].decode("latin-1")
        with self.draw_lock:
            rule = next((r for r in self.holds if r[0].search(text)), None)
            if rule is None:
                return
            self.holds.remove(rule)
        arrived = time.monotonic()
        try:
            rule[1].wait()
            released = time.monotonic()
        except threading.BrokenBarrierError:
            released = None
        self.held.append((arrived, released, urllib.parse.unquote(target)))

    def forced_answer(self, target, method="GET", body=b""):
        decoded = urllib.parse.unquote(target)
        inner = ([urllib.parse.unquote(line) for line in body.decode("latin-1").splitlines()]
                 if "/batch/" in target else [])
        with self.draw_lock:
            for rule in self.forced:
                text, wanted = rule[0], rule[3]
                hit = ((wanted is None or wanted == method) and text in decoded) or (
                    wanted is not None and any(line.startswith(wanted + " ") and text in line
                                               for line in inner))
                if hit and rule[4] > 0:  # let through, as asked
                    rule[4] -= 1
                    continue
                if hit and rule[2] != 0:
                    if rule[2] is not None:
                        rule[2] -= 1
                    self.forced_hits.append((rule[1], decoded))
                    return rule[1]
        return None

    def generation(self, bucket, name):
        """The object's current generation from the emulator, 0 when it does not exist."""
        path = f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"
        status, body = _split(self.forward(
            f"GET {path} HTTP/1.1\r\nHost: {self.upstream[0]}\r\n\r\n".encode(), b""))
        return int(json.loads(body)["generation"]) if status == 200 else 0

    def forward(self, head, body):
        """One request to the emulator (which answers and closes) -> its raw answer."""
        lines = [l for l in head.split(b"\r\n")[:-2] if l.split(b":")[0].strip().lower()
                 not in (b"transfer-encoding", b"content-length", b"expect",
                         b"connection", b"proxy-connection")]
        head = b"\r\n".join(lines + [b"Content-Length: %d" % len(body), b"Connection: close",
                                     b"", b""])
        with socket.create_connection(self.upstream, timeout=60) as up:
            up.sendall(head + body)
            answer = b""
            while chunk := up.recv(65536):
                answer += chunk
        return answer


def _split(answer):
    """(status, body) of a raw HTTP answer; status 0 when there is none."""
    head, _, body = answer.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    return (int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0), body


def _preconditions(target, method="POST"):
    """{condition: generation} of a request; a GET of `generation=N` counts as
    ifGenerationMatch=N answered 404 (that generation is gone), as GCS answers it."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
    found = {k: int(v[0]) for k, v in query.items()
             if k in ("ifGenerationMatch", "ifGenerationNotMatch")}
    if method == "GET" and "generation" in query and "/o/" in target:
        found["generation"] = int(query["generation"][0])
    return found


def _not_found():
    return _error(404, "Not Found")


def _object_name(target, head, body):
    """(bucket, object name) a request is about: the path's last /b/B/o/NAME, or for an
    upload the `name` query parameter or the name in its JSON (or multipart JSON) metadata."""
    split = urllib.parse.urlsplit(target)
    found = _OBJECT.match(split.path)
    if found:
        bucket, name = found.groups()
        return urllib.parse.unquote(bucket), urllib.parse.unquote(name)
    bucket = re.search(r"/b/([^/?]+)/o", split.path).group(1)
    query = urllib.parse.parse_qs(split.query)
    if "name" in query:
        return bucket, query["name"][0]
    content_type = (_header(head, b"content-type") or b"").decode()
    if "boundary=" in content_type:
        boundary = content_type.split("boundary=")[1].strip('"').encode()
        body = body.split(b"--" + boundary)[1].partition(b"\r\n\r\n")[2]
    return bucket, json.loads(body.strip() or b"{}")["name"]


def _precondition_failed():
    body = json.dumps({"error": {"code": 412, "message": "At least one of the pre-conditions "
                                 "you specified did not hold.",
                                 "errors": [{"reason": "conditionNotMet"}]}}).encode()
    return (b"HTTP/1.1 412 Precondition Failed\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body


def _error(code, reason):
    body = json.dumps({"error": {"code": code, "message": reason}}).encode()
    return (b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % (code, reason.encode(), len(body))) + body


def _reset(sock):
    """Close with a TCP RST: the client sees 'connection reset by peer'."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        sock, server = self.request, self.server
        sock.settimeout(60)
        head, body = _read_head(sock)
        if head is None:
            return
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        method, target = request_line.split(" ")[:2]
        body = read_body(sock, head, body)
        if body is None:
            return
        forced = server.forced_answer(target, method, body)
        if forced == "timeout":
            time.sleep(STALL)
            _reset(sock)
            return
        if forced:
            sock.sendall(_error(forced, {403: "Forbidden", 429: "Too Many Requests",
                                         503: "Service Unavailable"}.get(forced, "Error")))
            return
        server.wait_if_held(target, body)
        fault = server.draw(method, target.split("?")[0])
        if fault in ("503", "429"):
            sock.sendall(_error(int(fault), "Service Unavailable" if fault == "503"
                                else "Too Many Requests"))
            return
        if fault == "drop":
            _reset(sock)
            return
        upload_id = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query).get("upload_id")
        if upload_id and upload_id[0] in server.finished_uploads:
            # GCS answers a completed resumable session with the object (200), which is how
            # a client whose last answer was lost learns it is done; the emulator forgets
            # finished sessions (404), so answer for it.
            sock.sendall(server.finished_uploads[upload_id[0]])
            return
        conditions = _preconditions(target, method)
        if conditions:
            with server.cas_lock:
                bucket, name = _object_name(target, head, body)
                current = server.generation(bucket, name)
                held = all(current == v if k != "ifGenerationNotMatch" else current != v
                           for k, v in conditions.items())
                if held:
                    answer = server.forward(head, body)
                elif "generation" in conditions:
                    answer = _not_found()
                else:
                    answer = _precondition_failed()
                    server.refused_412 += 1
        else:
            answer = server.forward(head, body)
        if upload_id and _split(answer)[0] in (200, 201):
            server.finished_uploads[upload_id[0]] = answer
        if fault == "drop_after":
            _reset(sock)
            return
        sock.sendall(answer)
