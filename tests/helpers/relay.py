"""A TCP relay between a SuperNode and the SuperLink's Fleet API that cuts connections on command or on a schedule.

``CuttingRelay(target_port)`` listens on a free loopback port and forwards every connection to
``127.0.0.1:target_port``. It reads the plain HTTP/1.1 it carries (insecure Fleet API only: with TLS it
cannot see requests and only :meth:`cut_all` / ``every_s`` work), so a test can cut exactly while an order is
in flight instead of by the wall clock:

* :meth:`swallow_next` arms a one-shot: the next response to a request for ``path`` whose body is not empty
  (for ``/v1/fleet/pull-messages``: the response that hands an order to the SuperNode, after the SuperLink has
  marked it delivered) is dropped and that connection reset. The returned event is set when it happened.
* :meth:`cut_all` resets every open connection now.
* ``every_s`` resets every open connection each ``every_s`` seconds (the issue's "relay that resets every
  connection every 20 s"; for measurements, not for tests).

Command line (measurements): ``python tests/helpers/relay.py --listen 9200 --target 9100 --every-s 20``.
"""

from __future__ import annotations

import argparse
import socket
import struct
import threading
from collections import deque

__all__ = ["CuttingRelay"]

_HEADER_END = b"\r\n\r\n"


def _reset(sock: socket.socket) -> None:
    """Drop ``sock`` at once (SO_LINGER 0: a reset, not a graceful close), as a middlebox cutting a connection does."""
    for act in (lambda: sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)),
                lambda: sock.shutdown(socket.SHUT_RDWR),  # wakes the other pump thread blocked in recv()
                sock.close):
        try:
            act()
        except OSError:
            pass


class _Framer:
    """Splits one direction of an HTTP/1.1 byte stream into whole messages (header + Content-Length body).

    ``feed`` returns the complete messages as ``(start_line, body, raw)``; ``None`` as start line means the
    stream could not be framed (no Content-Length, chunked): the caller passes it through unparsed."""

    def __init__(self) -> None:
        self.buf = b""
        self.broken = False

    def feed(self, data: bytes) -> list[tuple[bytes | None, bytes, bytes]]:
        if not self.broken and not self.buf and not data[:1].isalpha():
            self.broken = True  # not HTTP/1.1 text (TLS): pass it through unparsed
        if self.broken:
            return [(None, b"", data)]
        self.buf += data
        out = []
        while (end := self.buf.find(_HEADER_END)) >= 0:
            head = self.buf[:end]
            lines = head.split(b"\r\n")
            length, chunked = None, False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
                chunked |= name.strip().lower() == b"transfer-encoding"
            if chunked or (length is None and lines[0].startswith(b"HTTP/")):
                self.broken, rest, self.buf = True, self.buf, b""
                out.append((None, b"", rest))
                return out
            length = length or 0  # a request without a body
            total = end + len(_HEADER_END) + length
            if len(self.buf) < total:
                break
            raw, self.buf = self.buf[:total], self.buf[total:]
            out.append((lines[0], raw[end + len(_HEADER_END):], raw))
        return out


class _Connection:
    def __init__(self, relay: CuttingRelay, client: socket.socket, server: socket.socket) -> None:
        self.relay, self.client, self.server = relay, client, server
        self.paths: deque[bytes] = deque()
        self.closed = False
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._upstream, daemon=True).start()
        threading.Thread(target=self._downstream, daemon=True).start()

    def cut(self, *, by_relay: bool = True) -> None:
        """Reset both sides (``by_relay``: counted in :attr:`CuttingRelay.cuts`; else one side closed first)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        _reset(self.client)
        _reset(self.server)
        self.relay._forget(self, counted=by_relay)

    def _upstream(self) -> None:
        framer = _Framer()
        try:
            while data := self.client.recv(65536):
                for start, _body, _raw in framer.feed(data):
                    if start is not None:
                        parts = start.split(b" ")
                        self.paths.append(parts[1] if len(parts) > 1 else b"")
                self.server.sendall(data)
        except OSError:
            pass
        self.cut(by_relay=False)

    def _downstream(self) -> None:
        framer = _Framer()
        try:
            while data := self.server.recv(65536):
                for start, body, raw in framer.feed(data):
                    path = self.paths.popleft() if start is not None and self.paths else b""
                    if start is not None and self.relay._take(path.decode("latin-1"), body):
                        self.cut()
                        return
                    self.client.sendall(raw)
        except OSError:
            pass
        self.cut(by_relay=False)


class CuttingRelay:
    """Relay ``127.0.0.1:<port>`` → ``target_host:target_port`` that cuts connections on command (module docstring).

    Use as a context manager or call :meth:`close`. ``cuts`` counts connections reset by the relay."""

    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1", port: int = 0,
                 every_s: float | None = None) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self.cuts = 0
        self.swallowed: list[str] = []
        """Paths of the responses dropped by :meth:`swallow_next`."""
        self._conns: set[_Connection] = set()
        self._lock = threading.Lock()
        self._armed: list[tuple[str, threading.Event]] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()
        if every_s:
            threading.Thread(target=self._schedule, args=(every_s,), daemon=True).start()

    def swallow_next(self, path: str = "/v1/fleet/pull-messages") -> threading.Event:
        """Drop the next non-empty response to a request for ``path`` and reset its connection (one-shot)."""
        event = threading.Event()
        with self._lock:
            self._armed.append((path, event))
        return event

    def cut_all(self) -> int:
        """Reset every open connection now; returns how many."""
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            conn.cut()
        return len(conns)

    def close(self) -> None:
        self._stop.set()
        try:
            self._listener.close()
        except OSError:
            pass
        self.cut_all()

    def __enter__(self) -> CuttingRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take(self, path: str, body: bytes) -> bool:
        """True when an armed swallow matches this response (and disarm it)."""
        if not body:
            return False
        with self._lock:
            for i, (want, event) in enumerate(self._armed):
                if path == want:
                    del self._armed[i]
                    self.swallowed.append(path)
                    event.set()
                    return True
        return False

    def _forget(self, conn: _Connection, *, counted: bool) -> None:
        with self._lock:
            self._conns.discard(conn)
            self.cuts += counted

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            conn = _Connection(self, client, server)
            with self._lock:
                self._conns.add(conn)
            conn.start()

    def _schedule(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.cut_all()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", type=int, required=True, help="port to listen on (127.0.0.1)")
    ap.add_argument("--target", type=int, required=True, help="the SuperLink's port on 127.0.0.1")
    ap.add_argument("--every-s", type=float, default=20.0, help="reset every connection this often (seconds)")
    args = ap.parse_args()
    relay = CuttingRelay(args.target, port=args.listen, every_s=args.every_s)
    print(f"relay 127.0.0.1:{relay.port} -> 127.0.0.1:{args.target}, cutting every {args.every_s:g} s", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        relay.close()


if __name__ == "__main__":
    main()
