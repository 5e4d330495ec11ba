"""Start-up of `corpusmill serve`: the token, the state folder, the shared Dask cluster, the server."""
from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import stat
import sys
from pathlib import Path
from typing import Callable, Optional

from ..config import ConfigError

TOKEN_ENV = "CORPUSMILL_TOKEN"
MIN_TOKEN_CHARS = 16
DEFAULT_DASHBOARD = "127.0.0.1:0"


class ServiceError(ConfigError):
    """The service cannot start as asked; the message says why and what to do."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def load_token(token_file: Optional[str], host: str, state_dir: Path, log: Callable[[str], None]) -> str:
    """The bearer token: CORPUSMILL_TOKEN, else --token-file; on loopback with neither, one generated
    into STATE/token (mode 0600). Never from a command-line argument (it would show in `ps`)."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    source = f"${TOKEN_ENV}"
    if not token and token_file:
        try:
            path = Path(token_file)
            token = path.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ServiceError(f"--token-file {token_file}: cannot read it: {e.strerror}") from None
        if not token:
            raise ServiceError(f"--token-file {token_file} is empty")
        if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            log(f"service: warning: {token_file} is readable by others; chmod 600 it")
        source = token_file
    if token:
        if len(token) < MIN_TOKEN_CHARS:
            raise ServiceError(f"the token from {source} has {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
                               "(e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
        return token
    if not is_loopback(host):
        raise ServiceError(f"refusing to listen on {host} (not a loopback address) without a token: set {TOKEN_ENV} "
                           "or pass --token-file FILE")
    path = state_dir / "token"
    if path.is_file():
        token = path.read_text(encoding="utf-8").strip()
    if len(token) < MIN_TOKEN_CHARS:
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    log(f"service: no token given; using the one in {path} (send it as 'Authorization: Bearer <token>')")
    return token


def _dashboard_host(address: str) -> str:
    """The host of a HOST:PORT dashboard address (empty: all interfaces); ServiceError when it is not one."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ServiceError(f"--dashboard-address {address}: expected HOST:PORT (e.g. 127.0.0.1:8790; port 0 = a free one)")
    host = host.strip("[]")
    if host and host not in ("0.0.0.0", "::"):
        try:
            socket.getaddrinfo(host, None)
        except OSError as e:
            raise ServiceError(f"--dashboard-address {address}: unknown host {host} ({e.strerror or e})") from None
    return host


def _dashboard_link(client, address: Optional[str]) -> Optional[str]:
    """The dashboard's URL, on the host it was asked to listen on (Dask's link names the scheduler's host)."""
    port = client.scheduler_info().get("services", {}).get("dashboard")
    if not port:
        return None
    host = address.rpartition(":")[0] if address and ":" in address else (address or "")
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        return client.dashboard_link
    return f"http://{host}:{port}/status"


def _listen(host: str, port: int) -> socket.socket:
    """The service's listening socket, bound now, so a port in use is refused before the cluster starts."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except OSError as e:
        raise ServiceError(f"--host {host}: cannot resolve it ({e.strerror or e})") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ServiceError(f"--port {port}: cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def _check_url_roots(roots) -> None:
    """A URL data root needs its fsspec filesystem package (s3fs for s3://): said at start, not by
    the first job. Nothing is sent to the store here (its endpoint and credentials are the
    environment's, read when a job lists or writes objects)."""
    from corpusmill.stages import storage

    for root in roots.urls:
        try:
            storage.filesystem(root.url)
        except storage.StorageError as e:
            raise ServiceError(f"--data-root {e}") from None


def serve(host: str, port: int, state_dir: str, data_roots: list[str], *, scheduler: Optional[str] = None,
          token_file: Optional[str] = None, max_concurrent: int = 1, max_queued: int = 100,
          n_workers: Optional[int] = None, dashboard_address: str = DEFAULT_DASHBOARD,
          log: Callable[[str], None] = print) -> int:
    """Run the service until SIGINT/SIGTERM; running jobs are stopped and resumed at the next start.

    The LocalCluster's Dask dashboard has no authentication: it listens on loopback (a free port)
    unless `dashboard_address` asks for another address, which is logged as a warning."""
    import uvicorn

    from ..config import ClusterConfig
    from ..engine import dask_client
    from .app import ServiceContext, create_app
    from .guard import DataRoots
    from .store import JobStore
    from .supervisor import Supervisor

    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    token = load_token(token_file, host, state, log)
    forbidden = [str(state)] + ([str(Path(token_file).resolve())] if token_file else [])
    try:
        roots = DataRoots(data_roots or [os.getcwd()], forbidden=forbidden, work_area=str(state / "work"))
    except ValueError as e:
        raise ServiceError(str(e)) from None
    _check_url_roots(roots)
    if max_concurrent < 1 or max_queued < 1:
        raise ServiceError("--max-concurrent and --max-queued must be at least 1")
    store = JobStore(state)
    # the engine's own cluster set-up: the given scheduler, or one LocalCluster (with its dashboard) for all jobs
    dash_host = _dashboard_host(dashboard_address)
    try:
        cluster_cfg = ClusterConfig(address=scheduler, n_workers=n_workers, dashboard=True,
                                    dashboard_address=dashboard_address)
    except ValueError as e:
        raise ServiceError(f"--workers / --dashboard-address: {e}") from None
    listener = _listen(host, port)  # before anything is started or announced: a taken port is one line
    if not scheduler and not is_loopback(dash_host or "0.0.0.0"):
        log(f"service: warning: the Dask dashboard listens on {dashboard_address}, beyond this machine, without "
            "authentication")
    try:
        with dask_client(cluster_cfg, log=log) as client:
            address = client.scheduler.address
            dashboard = _dashboard_link(client, dashboard_address if not scheduler else None)
            supervisor = Supervisor(store, state, address, max_concurrent, log=log, roots=roots)
            ctx = ServiceContext(store=store, roots=roots, supervisor=supervisor, token=token, scheduler=address,
                                 dashboard=dashboard, max_queued=max_queued)
            log(f"service: http://{host}:{port} (OpenAPI at /openapi.json); Dask scheduler {address}, dashboard "
                f"{dashboard or 'not running'}; state {state}; data roots {', '.join(roots.roots)}; "
                f"{max_concurrent} job(s) at a time, {max_queued} queued at most")
            sys.stdout.flush()
            server = uvicorn.Server(uvicorn.Config(create_app(ctx), host=host, port=port, log_level="warning",
                                                   access_log=False))
            server.run(sockets=[listener])
    finally:
        listener.close()
        store.close()
    return 0
