"""Servers the team tests start on 127.0.0.1 and stop themselves: a throw-away PostgreSQL cluster
(Debian's binaries) and `mlflow server` over a sqlite file or that database, artifacts served by the
server (--serve-artifacts), open or locked (`locked_server`: MLflow's basic-auth app behind uvicorn's TLS,
a self-signed certificate, as docs/scale.md sets it up). Used by tests/test_postgres.py,
tests/test_ray_cluster.py, tests/test_team_cluster.py and tests/test_locked_server.py."""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

START_DEADLINE_S = 120  # a server starting on 2 busy cores
# A tracking-only server, as docs/scale.md recommends: MLflow's job execution (GenAI scoring, trace
# archival) keeps both cores busy for about 6 s after /health answers, slowing whatever the test runs next.
TRACKING_ONLY = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


# The ports the tests' servers listen on (PostgreSQL, MLflow, Ray's heads, model servers) come from below
# the kernel's ephemeral range (32768-60999 on Linux: every client connection and every bind to port 0
# draws from it) and above Ray's worker ports (10002-19999): no connection can take a port between the
# moment a test picks it and the moment its server binds it. Each of xdist's workers (PYTEST_XDIST_WORKER,
# gw<k>) picks in a block of its own, so two workers never pick the same port at once; within its block a
# process starts at an offset of its pid (two pytest sessions side by side start apart) and moves on.
PORT_BASE = 20000
PORTS_PER_WORKER = 500
PORT_CURSOR = itertools.count(os.getpid() % PORTS_PER_WORKER)  # this process's next candidate in its block


def port_block() -> Tuple[int, int]:
    """[first, last) of this process's ports: its xdist worker's block below the ephemeral range."""
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    blocks = max(1, (ephemeral_low - PORT_BASE) // PORTS_PER_WORKER)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    first = PORT_BASE + (int(worker) if worker.isdigit() else 0) % blocks * PORTS_PER_WORKER
    return first, first + PORTS_PER_WORKER


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, from this process's block (`port_block`), never one it gave before
    (until the block wraps around)."""
    first, last = port_block()
    for _ in range(last - first):
        port = first + next(PORT_CURSOR) % (last - first)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken: the next
            return port
    raise RuntimeError(f"no free port in {first}-{last - 1} on 127.0.0.1")


def as_postgres_user(command: List[str]) -> List[str]:
    """PostgreSQL refuses to run as root: run as the `postgres` user there."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def postgres_binaries() -> Path:
    """The newest Debian PostgreSQL bin folder with initdb and pg_ctl, or a skip saying what is missing."""
    folders = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name))
    if not folders or not (Path(folders[-1]) / "initdb").exists():
        pytest.skip("no PostgreSQL binaries under /usr/lib/postgresql/*/bin (apt-get install postgresql)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: PostgreSQL cannot be started as root")
    pytest.importorskip("psycopg", reason="the PostgreSQL driver is not installed (pip install 'tamrun[team]')")
    return Path(folders[-1])


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A throw-away PostgreSQL cluster on 127.0.0.1 with a database `mlflow`; yields its URI (trust auth,
    no password). Stopped and removed afterwards, also on failure; a skip where it cannot run."""
    binaries = postgres_binaries()
    root = Path(tempfile.mkdtemp(prefix="tamrun-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data, port = root / "data", free_port()
    try:
        subprocess.run(as_postgres_user([str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
                                         "-E", "UTF8"]), check=True, capture_output=True, timeout=120)
        subprocess.run(as_postgres_user([str(binaries / "pg_ctl"), "-D", str(data), "-l", str(root / "pg.log"), "-w",
                                         "-o", f"-k {root} -p {port} -c listen_addresses=127.0.0.1", "start"]),
                       check=True, capture_output=True, timeout=120)
        subprocess.run(as_postgres_user([str(binaries / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U",
                                         "postgres", "mlflow"]), check=True, capture_output=True, timeout=60)
        yield f"postgresql://postgres@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run(as_postgres_user([str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                       capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)


class MlflowServer:
    """`mlflow server` on 127.0.0.1 over ``backend`` (a database URI) with artifacts served from
    ``artifacts``; its process group is stopped by `stop` (a signal to the whole group)."""

    def __init__(self, backend: str, artifacts: Path, log: Path, workers: int = 2, extra: Sequence[str] = (),
                 env: Optional[Dict[str, str]] = None, certificate: Optional[Path] = None) -> None:
        self.backend, self.artifacts, self.log, self.workers, self.extra = backend, artifacts, log, workers, list(extra)
        self.env, self.certificate = dict(env or {}), certificate  # certificate: served over TLS, trusting it
        self.port = free_port()
        self.uri = f"{'https' if certificate else 'http'}://127.0.0.1:{self.port}"
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> "MlflowServer":
        with open(self.log, "a") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.backend, "--serve-artifacts",
                 "--artifacts-destination", str(self.artifacts), "--host", "127.0.0.1", "--port", str(self.port),
                 "--workers", str(self.workers), *self.extra], stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, **TRACKING_ONLY, **self.env})
        trust = ssl.create_default_context(cafile=str(self.certificate)) if self.certificate else None
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2, context=trust):
                    return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise AssertionError(f"mlflow server did not answer /health in {START_DEADLINE_S} s:\n"
                             f"{self.log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        self.process = None


@contextlib.contextmanager
def mlflow_server(folder: Path, backend: Optional[str] = None, workers: int = 1) -> Iterator[str]:
    """`MlflowServer` over ``backend`` (default: a sqlite file in ``folder``), artifacts and log in
    ``folder``; yields its URI and stops it afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    server = MlflowServer(backend or f"sqlite:///{folder / 'mlflow.db'}", folder / "artifacts",
                          folder / "server.log", workers)
    try:
        yield server.start().uri
    finally:
        server.stop()


@contextlib.contextmanager
def model_server(python: str, model: str, log: Path, env: Optional[dict] = None, env_manager: str = "local",
                 deadline_s: float = START_DEADLINE_S) -> Iterator[str]:
    """`mlflow models serve -m <model> --env-manager <env_manager>` of the Python ``python`` on 127.0.0.1
    (``local``: its environment serves the model; ``virtualenv``: MLflow builds the model's own from its
    requirements first); yields its URL once /ping answers (within ``deadline_s``) and stops its process
    group afterwards."""
    port = free_port()
    path = f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # MLflow runs its server by name (uvicorn)
    with open(log, "a") as out:
        process = subprocess.Popen([python, "-m", "mlflow", "models", "serve", "-m", model, "--env-manager", env_manager,
                                    "--host", "127.0.0.1", "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, env={**os.environ, "PATH": path, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + deadline_s
        while True:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"the model server did not answer /ping:\n{log.read_text()[-3000:]}"
                time.sleep(0.5)
        yield url
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


# --- a locked server: MLflow's basic-auth app behind TLS (docs/scale.md) -----------------------------------

ADMIN = "admin"
# Passwords of the locked server's accounts (MLflow's auth app wants at least 12 characters): the admin's
# first one (its bootstrap), then the one it is changed to, and the two users'.
FIRST_ADMIN_PASSWORD, ADMIN_PASSWORD = "first-admin-pw-0", "changed-admin-pw-1"
USERS = {"writer": "writer-secret-pw-2", "reader": "reader-secret-pw-3"}
TEAM_EXPERIMENT = "team"
TEAM_PERMISSIONS = {"writer": "EDIT", "reader": "READ"}
CERTIFICATE_DAYS = 2
AUTH_INI = """[mlflow]
default_permission = NO_PERMISSIONS
database_uri = sqlite:///{folder}/basic_auth.db
admin_username = {admin}
authorization_function = {authorization}
"""
BASIC_AUTH = "mlflow.server.auth:authenticate_request_basic_auth"  # MLflow's own: a user and a password
TOKEN_AUTH = "token_auth:authenticate"  # a bearer token, else basic auth (tests/token_auth.py)


def self_signed_certificate(folder: Path) -> Path:
    """A self-signed certificate (and its key, ``server.key``) for 127.0.0.1 and localhost in ``folder``,
    made as docs/scale.md makes it (openssl); returns the certificate's path."""
    key, certificate = folder / "server.key", folder / "server.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(certificate), "-days", str(CERTIFICATE_DAYS), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return certificate


def credentials(user: Optional[str], password: Optional[str], certificate: Optional[Path]) -> Dict[str, str]:
    """MLflow's client variables for ``user`` (none given: no credentials) trusting ``certificate``."""
    env = {"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password,
           "MLFLOW_TRACKING_SERVER_CERT_PATH": str(certificate) if certificate else None}
    return {name: value for name, value in env.items() if value is not None}


@contextlib.contextmanager
def client_env(env: Dict[str, str]) -> Iterator[None]:
    """This process's MLflow client variables set to ``env`` (the others of them unset) for the block."""
    names = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
             "MLFLOW_TRACKING_SERVER_CERT_PATH", "MLFLOW_TRACKING_INSECURE_TLS")
    saved = {name: os.environ.pop(name, None) for name in names}
    os.environ.update(env)
    try:
        yield
    finally:
        for name in names:
            os.environ.pop(name, None)
            if saved[name] is not None:
                os.environ[name] = saved[name]


def lock_down(server: MlflowServer) -> None:
    """As its admin: the admin's password changed from its first one, the users created and the team
    experiment made, one user may EDIT it and the other only READ (`TEAM_PERMISSIONS`)."""
    from mlflow.server import get_app_client
    from mlflow.tracking import MlflowClient

    with client_env(credentials(ADMIN, FIRST_ADMIN_PASSWORD, server.certificate)):
        get_app_client("basic-auth", tracking_uri=server.uri).update_user_password(ADMIN, ADMIN_PASSWORD,
                                                                                  current_password=FIRST_ADMIN_PASSWORD)
    with client_env(credentials(ADMIN, ADMIN_PASSWORD, server.certificate)):
        auth = get_app_client("basic-auth", tracking_uri=server.uri)
        for user, password in USERS.items():
            auth.create_user(user, password)
        experiment = MlflowClient(tracking_uri=server.uri).create_experiment(TEAM_EXPERIMENT)
        for user, permission in TEAM_PERMISSIONS.items():
            auth.grant_user_permission(user, "experiment", experiment, permission)


@contextlib.contextmanager
def locked_server(folder: Path, backend: Optional[str] = None, workers: int = 1,
                  authorization: str = BASIC_AUTH) -> Iterator[MlflowServer]:
    """`mlflow server --app-name basic-auth` over TLS (uvicorn's ssl options, a self-signed certificate) on
    127.0.0.1, ``--allowed-hosts`` naming it, a new user allowed nothing (NO_PERMISSIONS), locked down by
    `lock_down`; yields the running server and stops it afterwards. ``authorization``: the auth app's
    ``authorization_function`` (a module of tests/ may be named: the server imports from there too)."""
    folder.mkdir(parents=True, exist_ok=True)
    certificate = self_signed_certificate(folder)
    config = folder / "basic_auth.ini"
    config.write_text(AUTH_INI.format(folder=folder, admin=ADMIN, authorization=authorization))
    env = {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_AUTH_ADMIN_PASSWORD": FIRST_ADMIN_PASSWORD,
           "MLFLOW_FLASK_SERVER_SECRET_KEY": "tests-csrf-key",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))}
    server = MlflowServer(backend or f"sqlite:///{folder / 'mlflow.db'}", folder / "artifacts", folder / "server.log",
                          workers, env=env, certificate=certificate)
    server.extra = ["--app-name", "basic-auth", "--uvicorn-opts",
                    f"--ssl-keyfile {folder / 'server.key'} --ssl-certfile {certificate}",
                    "--allowed-hosts", f"127.0.0.1:{server.port},localhost:{server.port}"]
    try:
        lock_down(server.start())
        yield server
    finally:
        server.stop()


def dated_certificate(folder: Path, days: Tuple[int, int], names: Sequence[str] = ("localhost", "127.0.0.1")) -> Path:
    """A self-signed certificate for ``names`` valid from ``days[0]`` to ``days[1]`` days from now (both
    negative: expired; both positive: not yet valid), and its key ``<name>.key``, in ``folder``; made with
    `cryptography` (mlflow's dependency), since openssl's ``-days`` takes no date in the past. Returns its path."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    alternatives = []
    for name in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now + datetime.timedelta(days=days[0]))
                   .not_valid_after(now + datetime.timedelta(days=days[1]))
                   .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    path = folder / f"dated{days[0]}_{days[1]}.crt"
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    return path


@contextlib.contextmanager
def tls_listener(certificate: Path) -> Iterator[int]:
    """A TLS endpoint on 127.0.0.1 presenting ``certificate`` (its key beside it, ``.key``): each connection
    gets its handshake (which the client may refuse) and is closed; yields the port. What a client's
    certificate check sees of a server, without starting one."""
    import threading

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, certificate.with_suffix(".key"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", free_port()))
    listener.listen(8)
    listener.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            with contextlib.suppress(OSError):
                connection.settimeout(10)
                context.wrap_socket(connection, server_side=True).close()
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=30)
        listener.close()
