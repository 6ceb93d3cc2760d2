"""Webhook receivers for the tests and ``benchmarks/bench_webhooks.py``: one that records what
it is sent (:class:`Catcher`) and one that never answers (:class:`Dead`).

    catcher = Catcher()                # http://127.0.0.1:<catcher.port>/..., answers 200
    dead = Dead()                      # accepts connections, never reads or answers
"""
from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Catcher", "Dead"]


class Catcher:
    """An HTTP receiver on ``host`` (any free port, or ``port``) that records every request as
    ``(path, headers, body, arrival)`` (``time.monotonic()`` when its headers were read) and
    answers 200 with ``answer``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, answer: str = "ok") -> None:
        self.got: list[tuple[str, dict[str, str], bytes, float]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                arrival = time.monotonic()
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with outer._lock:
                    outer.got.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body, arrival))
                self.send_response(200)
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.host, self.port = host, self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def requests(self) -> list[tuple[str, dict[str, str], bytes, float]]:
        with self._lock:
            return list(self.got)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Dead:
    """Accepts every connection on 127.0.0.1 and never reads or answers; keeps the sockets open
    until :meth:`close` (then every request still waiting on it fails at once)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.conns.append(conn)

    def accepted(self) -> int:
        with self._lock:
            return len(self.conns)

    def close(self) -> None:
        self.sock.close()
        with self._lock:
            for conn in self.conns:
                conn.close()
