"""A TCP proxy on 127.0.0.1 that a test can make stop forwarding: a dropped network on demand.

``TcpProxy(port)`` listens on a free port of 127.0.0.1 and forwards every connection to
``127.0.0.1:port``. ``stall()`` stops forwarding on the connections open now (bytes wait in
the kernel's buffers, as behind a dead link: nothing is closed, nothing answers);
``stall(new=True)`` also stalls the connections made afterwards; ``stall(answers_only=True)``
forwards what the client sends but not what the server answers. ``resume()`` forwards again;
``close()`` stops the proxy and closes every connection.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading

from pg_server import free_port


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._lock = threading.Lock()
        self._stalled: dict[int, str] = {}  # connection number -> "both" / "answers"
        self._stall_new: str | None = None
        self._count = 0
        self._closing = False
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self, *, new: bool = False, answers_only: bool = False) -> None:
        mode = "answers" if answers_only else "both"
        with self._lock:
            for number in range(self._count):
                self._stalled[number] = mode
            self._stall_new = mode if new else None

    def resume(self) -> None:
        with self._lock:
            self._stalled.clear()
            self._stall_new = None

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._socks:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                number = self._count
                self._count += 1
                if self._stall_new is not None:
                    self._stalled[number] = self._stall_new
                self._socks += [client, upstream]
            threading.Thread(target=self._pump, args=(number, client, upstream),
                             daemon=True).start()

    def _pump(self, number: int, client: socket.socket, upstream: socket.socket) -> None:
        peer = {client: upstream, upstream: client}
        try:
            while not self._closing:
                with self._lock:
                    mode = self._stalled.get(number)
                readable = [] if mode == "both" else [client] if mode == "answers" else [
                    client, upstream]
                ready, _, _ = select.select(readable, [], [], 0.05)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peer[sock].sendall(data)
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.close()
