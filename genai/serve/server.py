"""Running the app with uvicorn (``genai serve``), in the foreground or in a background thread
(tests, benchmarks)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from genai.serve.app import ServeEngine, create_app

__all__ = ["BackgroundServer", "free_port", "listen", "run_server"]


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` for `run_server`, bound before the model loads
    so that a taken port is reported at once: `OSError` naming the address otherwise. As
    uvicorn binds: IPv6 for a host with a colon, else IPv4."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:  # (socket.gaierror too: a host name that does not resolve)
        sock.close()
        hint = " (choose another with --port)" if exc.errno == errno.EADDRINUSE else ""
        reason = exc.strerror or exc
        raise OSError(f"cannot listen on {host}:{port}: {reason}{hint}") from None
    sock.set_inheritable(True)
    return sock


def _no_color() -> bool:
    """``NO_COLOR`` set to anything but the empty string (no-color.org)."""
    return bool(os.environ.get("NO_COLOR"))


def run_server(
    engine: ServeEngine,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    api_key: str | None = None,
    allowed_origins: Sequence[str] = (),
    max_body_bytes: int | None = None,
    webui: bool = True,
    shutdown_timeout: float = 5.0,
    sock: socket.socket | None = None,
) -> int | None:
    """Serve ``engine`` until interrupted (``api_key``, ``allowed_origins``,
    ``max_body_bytes``, ``webui``: see `create_app`); after the signal, open requests get
    ``shutdown_timeout`` seconds to finish before they are cut. ``sock``: a socket from
    `listen` (else uvicorn binds ``host``:``port`` itself). Log lines are plain under
    ``NO_COLOR``. Returns the number of the signal that stopped the server, if one did."""
    import uvicorn

    cut = _CutAtShutdown()
    logging.getLogger("uvicorn.error").addFilter(cut)

    class Server(uvicorn.Server):
        stopped_by: int | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.stopped_by is None:
                self.stopped_by = sig
            super().handle_exit(sig, frame)
            # uvicorn raises the signals it caught again once it has shut down: SIGTERM would
            # then kill the process (status 143) after a clean shutdown. The caller reports
            # the signal (`stopped_by`): genai serve exits 0 after SIGTERM.
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured[:] = [s for s in captured if s != signal.SIGTERM]

    app = create_app(
        engine,
        api_key=api_key,
        allowed_origins=allowed_origins,
        max_body_bytes=max_body_bytes,
        webui=webui,
    )
    server = Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=shutdown_timeout,
            use_colors=False if _no_color() else None,
        )
    )
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        logging.getLogger("uvicorn.error").removeFilter(cut)
    return server.stopped_by


class _CutAtShutdown(logging.Filter):
    """Drops uvicorn's "Exception in ASGI application" traceback for a request it cancelled
    because the shutdown timeout passed: that cut is documented (``--shutdown-timeout``) and
    uvicorn's own line ("Cancel N running task(s), timeout graceful shutdown exceeded")
    already says it happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (
            isinstance(error, asyncio.CancelledError)
            and "timeout graceful shutdown exceeded" in str(error)
        )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class BackgroundServer:
    """uvicorn serving ``engine`` on ``host``:``port`` in a daemon thread; a context manager
    that waits until the server accepts connections and stops it on exit (``api_key``,
    ``allowed_origins``, ``max_body_bytes``: see `create_app`; ``config``: more
    `uvicorn.Config` options)."""

    def __init__(
        self,
        engine: ServeEngine,
        host: str = "127.0.0.1",
        port: int | None = None,
        *,
        api_key: str | None = None,
        allowed_origins: Sequence[str] = (),
        max_body_bytes: int | None = None,
        **config: Any,
    ) -> None:
        import uvicorn

        self.engine = engine
        self.host = host
        self.port = port or free_port(host)
        options = {"log_level": "warning", "access_log": False, **config}
        self._server = uvicorn.Server(
            uvicorn.Config(
                create_app(
                    engine,
                    api_key=api_key,
                    allowed_origins=allowed_origins,
                    max_body_bytes=max_body_bytes,
                ),
                host=host,
                port=self.port,
                **options,
            )
        )
        self._thread = threading.Thread(target=self._server.run, name="genai-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        """Start and wait until the server is up."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server (and the engine's scheduler, through the app's lifespan)."""
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
