"""pytest fixtures: a real GCS JSON-API server (gcp-storage-emulator) on loopback.

tests/conftest.py registers this module as a plugin: a test takes `gcs` / `gcs_bucket`
as arguments, nothing to import.

`gcs` (module): starts `python -m gcp_storage_emulator start` in a subprocess on a free
127.0.0.1 port, in memory, and points every Google client in this process and its children
at it. `gcs_bucket` (function): a fresh, empty bucket name for one test.

How the clients are kept local and fast:

* STORAGE_EMULATOR_HOST: google-cloud-storage's `Client` (which Beam 2.77's gcsio uses via
  `gcsio.create_storage_client`) sends every request to this endpoint instead of
  storage.googleapis.com.
* GOOGLE_APPLICATION_CREDENTIALS: Beam always asks `google.auth.default()` for credentials
  first (`apache_beam.internal.gcp.auth`), and retries a failure 4 times with exponential
  back-off (~30 s) per process. We hand it a fake *authorized_user* file whose access token
  does not expire until 2999, so it resolves at once and is never refreshed (a refresh is the
  only call google-auth would make). The emulator ignores the bearer token.
* NO_GCE_CHECK, GOOGLE_CLOUD_PROJECT: no metadata-server probe, no project lookup.
* HTTP(S)_PROXY -> `GoogleProxy`, a loopback CONNECT proxy; NO_PROXY=127.0.0.1,localhost so
  the clients above talk to the emulator directly. The proxy is a guard and a bridge:
  - TensorFlow's gs:// filesystem (tf.io.gfile, TFRecordDataset) has no endpoint setting: its
    URLs are compiled in (https://www.googleapis.com/storage/v1/…,
    https://storage.googleapis.com/…).
    It does honour HTTPS_PROXY, CURL_CA_BUNDLE and GOOGLE_AUTH_TOKEN_FOR_TESTING, so the proxy
    terminates TLS for those two host names with a certificate from a throw-away CA made here
    (CURL_CA_BUNDLE points at it) and relays *storage* requests to the emulator. It also
    relays plain-http requests to those hosts: the emulator's resumable-upload Location is
    http://<Host header>/…, which TensorFlow then PUTs through the proxy.
  - Every other CONNECT (any other host, any non-storage path) is refused with 403: whatever
    still tried to reach Google fails at once, nothing leaves the machine.

The variables are set while a test module uses the fixture (subprocesses started by Beam
inherit them) and restored afterwards. Beam caches the credentials it found per process; they
are fake but harmless (nothing else here talks to GCS).
"""

import contextlib
import datetime
import gc
import json
import pathlib
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pytest

FAKE_PROJECT = "emulator-project"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(endpoint, proc, log, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gcp-storage-emulator exited with {proc.returncode}: "
                               f"{log.read_text(errors='replace')[-2000:]}")
        try:
            with _no_proxy_opener().open(endpoint + "/", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"gcp-storage-emulator did not answer on {endpoint} in {timeout:.0f}s")


def _no_proxy_opener():
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fake_credentials_file(directory):
    """An authorized_user ADC file whose token is valid until 2999: no refresh, no network."""
    path = pathlib.Path(directory) / "fake_adc.json"
    path.write_text(json.dumps({
        "type": "authorized_user",
        "client_id": "emulator.apps.example",
        "client_secret": "not-a-secret",
        "refresh_token": "not-a-refresh-token",
        "token": "emulator-token",
        "expiry": "2999-01-01T00:00:00Z",
        "quota_project_id": FAKE_PROJECT,
    }))
    return str(path)


def emulator_env(endpoint, credentials_file, proxy_url, ca_file):
    return {
        "STORAGE_EMULATOR_HOST": endpoint,
        "GOOGLE_APPLICATION_CREDENTIALS": credentials_file,
        "GOOGLE_CLOUD_PROJECT": FAKE_PROJECT,
        "NO_GCE_CHECK": "True",
        "HTTPS_PROXY": proxy_url, "https_proxy": proxy_url,
        "HTTP_PROXY": proxy_url, "http_proxy": proxy_url,
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        # TensorFlow's GCS filesystem: trust the proxy's CA, use a fixed token, fail fast.
        "CURL_CA_BUNDLE": ca_file,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator-token",
        "GCS_RETRY_CONFIG_MAX_RETRIES": "1",
        "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "1000",
    }


# --- the TLS-terminating proxy that lets tf.io.gfile reach the emulator -------------------

GOOGLE_STORAGE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
_STORAGE_PATHS = ("/storage/v1/", "/upload/storage/v1/", "/download/storage/v1/",
                  "/batch/storage/v1/")


def make_certificates(directory):
    """A throw-away CA and a server certificate for GOOGLE_STORAGE_HOSTS -> (ca, cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    validity = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=7))

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("gcs-emulator test CA"))
          .issuer_name(name("gcs-emulator test CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(validity[0]).not_valid_after(validity[1])
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(name(GOOGLE_STORAGE_HOSTS[0]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(validity[0]).not_valid_after(validity[1])
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName(h) for h in GOOGLE_STORAGE_HOSTS]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory = pathlib.Path(directory)
    paths = directory / "proxy-ca.pem", directory / "proxy-cert.pem", directory / "proxy-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return tuple(str(p) for p in paths)


def _read_head(sock, buffered=b""):
    """(head bytes up to and including the blank line, the bytes after it) or (None, b'')."""
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
        if len(data) > 1 << 20:
            return None, b""
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _read_chunked(sock, data):
    """Decode a chunked request body; `data` holds what was already read past the head."""
    body = b""
    while True:
        while b"\r\n" not in data:
            data += sock.recv(65536) or _eof()
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        while len(data) < size + 2:
            data += sock.recv(65536) or _eof()
        if size == 0:
            return body  # (no trailers from curl)
        body, data = body + data[:size], data[size + 2:]


def _eof():
    raise ConnectionError("client closed the connection mid-request")


def read_body(sock, head, body):
    """A request's whole body (None when the client hung up): answers `Expect: 100-continue`
    (else curl waits a second) and reads chunked bodies (TF's resumable-upload PUTs)."""
    if (_header(head, b"expect") or b"").lower() == b"100-continue":
        sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    if (_header(head, b"transfer-encoding") or b"").lower() == b"chunked":
        return _read_chunked(sock, body)
    length = int(_header(head, b"content-length") or 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        body += chunk
    return body


def _header(head, name):
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


class GoogleProxy(socketserver.ThreadingTCPServer):
    """HTTP CONNECT proxy on loopback: storage traffic for Google's GCS host names goes to the
    emulator (TLS terminated here); every other destination gets 403. `refused` lists what was
    turned away, so a test can assert that nothing tried to leave."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, emulator_endpoint, cert_file, key_file):
        host, _, port = emulator_endpoint.rpartition("//")[2].partition(":")
        self.upstream = (host, int(port))
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(cert_file, key_file)
        self.refused, self.relayed = [], 0
        super().__init__(("127.0.0.1", 0), _ProxyHandler)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        sock.settimeout(60)
        head, rest = _read_head(sock)
        if head is None:
            return
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        method, _, target = request_line.partition(" ")
        target = target.rsplit(" ", 1)[0]
        if method != "CONNECT":
            # Plain-http proxying: the emulator's resumable-upload Location is http://<Host>/…
            scheme, _, hostpath = target.partition("://")
            host, _, path = hostpath.partition("/")
            if scheme == "http" and host in GOOGLE_STORAGE_HOSTS:
                origin = f"{method} /{path} {request_line.rsplit(' ', 1)[1]}".encode("latin-1")
                self._relay(sock, host, origin + head[len(request_line):], rest)
            else:
                self._refuse(sock, request_line)
            return
        host = target.rsplit(":", 1)[0]
        if host not in GOOGLE_STORAGE_HOSTS:
            self._refuse(sock, request_line)
            return
        sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            tls = self.server.tls.wrap_socket(sock, server_side=True)
        except (ssl.SSLError, OSError):
            return
        with tls:
            head, rest = _read_head(tls)
            if head is not None:
                self._relay(tls, host, head, rest)

    def _refuse(self, sock, what):
        self.server.refused.append(what)
        sock.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def _relay(self, sock, host, head, body):
        """One request to the emulator (which closes after each answer); answer copied back."""
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        path = request_line.split(" ")[1] if " " in request_line else ""
        if host == "www.googleapis.com" and not path.startswith(_STORAGE_PATHS):
            self._refuse(sock, f"{host} {request_line}")
            return
        body = read_body(sock, head, body)
        if body is None:
            return
        # The emulator speaks HTTP/1.0 and reads Content-Length: hand it a plain request.
        lines = [l for l in head.split(b"\r\n")[:-2] if l.split(b":")[0].strip().lower()
                 not in (b"transfer-encoding", b"content-length", b"expect", b"proxy-connection")]
        head = b"\r\n".join(lines + [b"Content-Length: %d" % len(body), b"", b""])
        with socket.create_connection(self.server.upstream, timeout=60) as up:
            up.sendall(head + body)
            while True:
                chunk = up.recv(65536)
                if not chunk:
                    break
                sock.sendall(chunk)
        self.server.relayed += 1


@contextlib.contextmanager
def google_proxy(emulator_endpoint, workdir):
    ca, cert, key = make_certificates(workdir)
    proxy = GoogleProxy(emulator_endpoint, cert, key)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy, ca
    finally:
        proxy.shutdown()
        proxy.server_close()


class GcsEmulator:
    """The running server plus small helpers that use google-cloud-storage directly."""

    def __init__(self, endpoint, proxy=None):
        self.endpoint, self.proxy = endpoint, proxy
        self._client = None

    @property
    def client(self):
        if self._client is None:
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            self._client = storage.Client(project=FAKE_PROJECT,
                                          credentials=AnonymousCredentials())
        return self._client

    def create_bucket(self, name=None):
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(name)
        return name

    @staticmethod
    def split(uri):
        assert uri.startswith("gs://"), uri
        bucket, _, name = uri[5:].partition("/")
        return bucket, name

    def upload_bytes(self, uri, data):
        bucket, name = self.split(uri)
        self.client.bucket(bucket).blob(name).upload_from_string(data)
        return uri

    def upload_tree(self, local_dir, prefix):
        """Copy every file under local_dir to prefix/<relative path>; returns the uris."""
        local_dir, uris = pathlib.Path(local_dir), []
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            rel = path.relative_to(local_dir).as_posix()
            uris.append(self.upload_bytes(f"{prefix.rstrip('/')}/{rel}", path.read_bytes()))
        return uris

    def read(self, uri):
        bucket, name = self.split(uri)
        return self.client.bucket(bucket).blob(name).download_as_bytes()

    def read_json(self, uri):
        return json.loads(self.read(uri))

    def exists(self, uri):
        bucket, name = self.split(uri)
        return self.client.bucket(bucket).blob(name).exists()

    def list(self, prefix):
        """{gs://bucket/name: size} for every object under prefix."""
        bucket, name = self.split(prefix)
        return {f"gs://{bucket}/{b.name}": b.size
                for b in self.client.list_blobs(bucket, prefix=name)}


@contextlib.contextmanager
def run_emulator(workdir):
    """Start the emulator in a subprocess, set the environment, yield a GcsEmulator."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = pathlib.Path(workdir) / "emulator.log"
    with open(log, "wb") as out:  # a file, not a pipe nobody drains
        proc = subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
             "--port", str(port), "--in-memory", "--quiet"],
            cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_until_up(endpoint, proc, log)
        with google_proxy(endpoint, workdir) as (proxy, ca), \
                pytest.MonkeyPatch.context() as mp:
            env = emulator_env(endpoint, fake_credentials_file(workdir), proxy.url, ca)
            for key, value in env.items():
                mp.setenv(key, value)
            try:
                yield GcsEmulator(endpoint, proxy)
            finally:
                # A failed upload's writer retries its upload when it is garbage-collected;
                # let that happen now, while the server answers (404, at once), not at exit
                # against a closed port (connection errors are retried for ~2 minutes).
                gc.collect()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """A running GCS emulator for one test module, with the environment pointing at it
    (restored when the module is done, so other test files never see it)."""
    with run_emulator(tmp_path_factory.mktemp("gcs_emulator")) as emulator:
        yield emulator


@pytest.fixture
def gcs_bucket(gcs):
    """A new, empty bucket on the emulator (its name, not a gs:// uri)."""
    return gcs.create_bucket()
