"""A TCP proxy of a test's own in front of a real server, to cut the connection and restore it:
what a database that stops (or a network that partitions) looks like to its clients, without
stopping a server other tests use.

While cut, every open connection is closed and new ones are closed as soon as they are
accepted (the client reads end-of-stream, as from a server that went away); restored, new
connections reach the server again.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    """Listens on 127.0.0.1 (``port``) and forwards each connection to ``target``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open = True
        self._sockets: set[socket.socket] = set()
        self.cuts = 0  # connections refused or closed while cut
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    def cut(self) -> None:
        """Close every connection and refuse new ones until :meth:`restore`."""
        with self._lock:
            self._open = False
            open_sockets, self._sockets = self._sockets, set()
        for sock in open_sockets:
            _close(sock)

    def restore(self) -> None:
        with self._lock:
            self._open = True

    def close(self) -> None:
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            with self._lock:
                refused = not self._open
                self.cuts += refused
            if refused:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
