"""A TCP proxy on 127.0.0.1 that can turn into a black hole: it keeps every connection
open but stops forwarding in both directions, as a stalled server or a dead network path
would. For tests only (imported through sys.path); talks to loopback addresses alone."""

from __future__ import annotations

import select
import socket
import threading


class StallingProxy:
    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stalled = threading.Event()
        self.closing = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, dbname: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def stall(self) -> None:
        """From now on nothing passes, and nothing is closed."""
        self.stalled.set()

    def resume(self) -> None:
        """Forward again what was held and what comes next (a server that answers again)."""
        self.stalled.clear()

    def close(self) -> None:
        self.closing.set()
        for s in [self.listener, *self._sockets]:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target, timeout=10)
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        while not self.closing.is_set():
            try:
                ready, _, _ = select.select(list(peers), [], [], 0.1)
                if self.stalled.is_set():
                    continue  # hold everything: the peers see an open, silent connection
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
            except OSError:
                return
