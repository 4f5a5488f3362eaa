"""HTTP/1.1 over kept-alive TCP connections, for `shared.client.ServiceClient`'s calls to a service in the cluster.

httpx's client spends ~0.25 ms of CPU on a call before and after the socket (its URL, request and response objects,
the cookie jar, httpcore's connection pool and h11's pure-Python parser): 270 µs of client CPU against 17 µs for the
same POST of 30 kB written with one ``sendall`` and its answer parsed by httptools (the C parser uvicorn uses), on
loopback (/tmp microbenchmark, 2026-11-28). A window makes three such calls. This module is that short path: one
connection per calling thread and service, reused while the server keeps it open, the request written in one piece,
the answer parsed by ``httptools.HttpResponseParser`` (Content-Length, chunked, or up to the server's close).

Failures are httpx's exceptions, as httpx's client raises them, so the caller's retry rules do not change: a refused
or unreachable connect is ``ConnectError``, a connect that takes longer than its timeout ``ConnectTimeout``, a send or
read past the timeout ``WriteTimeout`` / ``ReadTimeout``, a reset ``WriteError`` / ``ReadError``, an answer cut short
or malformed ``RemoteProtocolError``. A connection the server has closed while it sat idle (uvicorn's keep-alive
timeout: 5 s) is noticed before it is reused (readable while no answer is due), as httpcore does, and replaced.
"""

from __future__ import annotations

import os
import re
import select
import socket
import threading
import weakref

import httptools
import httpx

_RECV = 1 << 18  # bytes read per recv: a window's answers are 10-60 kB
_ILLEGAL = re.compile(rb"[\r\n\x00]")


class _Answer:
    """httptools' callbacks for one response: status, headers (lower-case names, as received), body parts."""

    __slots__ = ("body", "complete", "framed", "headers", "keep_alive", "parser", "status")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.complete = False
        self.framed = False  # a Content-Length or Transfer-Encoding: else the body runs to the server's close
        self.keep_alive = False  # the connection stays open after this answer (read before the parser resets)

    def on_header(self, name: bytes, value: bytes) -> None:
        low = name.lower()
        if low in (b"content-length", b"transfer-encoding"):
            self.framed = True
        self.headers.append((low, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.status < 200:  # an interim answer (1xx): the real one follows on the same connection
            self.headers, self.body, self.framed = [], [], False
            return
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True


class HTTP11Connections:
    """Calls to one ``host:port`` over HTTP/1.1, one kept-alive connection per calling thread (thread-safe; a forked
    child opens its own instead of writing on its parent's). ``connect_timeout`` and ``timeout`` (each send and read)
    in s; None waits forever."""

    def __init__(self, host: str, port: int, *, connect_timeout: float | None, timeout: float | None) -> None:
        self.address = (host, port)
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self._local = threading.local()
        self._all: weakref.WeakSet[socket.socket] = weakref.WeakSet()  # every thread's, for `close`
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def call(self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
             ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One request: ``target`` the percent-encoded path and query, ``headers`` every header to send (names and
        values ASCII, Host among them; Content-Length when there is a body). (status, headers, body) back. Not for
        HEAD (its answer's length announces a body that never comes: the parser would wait for it)."""
        for name, value in headers:  # no header may end early and start another (h11's rule: httpx's client)
            if _ILLEGAL.search(name) or _ILLEGAL.search(value):
                raise httpx.LocalProtocolError(f"Illegal header value {value!r}" if _ILLEGAL.search(value)
                                               else f"Illegal header name {name!r}")
        sock = self._connection()
        head = b"".join((method.encode("ascii"), b" ", target, b" HTTP/1.1\r\n",
                         *(b"%s: %s\r\n" % kv for kv in headers), b"\r\n"))
        try:
            sock.sendall(head + body if body else head)
        except TimeoutError as exc:
            self._drop(sock)
            raise httpx.WriteTimeout(f"{method} {target!r}: send timed out ({exc})") from exc
        except OSError as exc:  # the server may have answered before it closed (a 413 for a body too large), as
            try:                # httpcore reads then too
                answer = self._read(sock, method, target)
            except httpx.TransportError:
                raise httpx.WriteError(f"{method} {target!r}: {exc}") from exc
            finally:
                self._drop(sock)
            return answer.status, answer.headers, b"".join(answer.body)
        answer = self._read(sock, method, target)
        if not answer.keep_alive:
            self._drop(sock)
        return answer.status, answer.headers, b"".join(answer.body)

    def _read(self, sock: socket.socket, method: str, target: bytes) -> _Answer:
        answer = _Answer()
        buf: bytearray | None = getattr(self._local, "buf", None)  # one buffer a thread, not 256 kB zeroed a call
        if buf is None:
            buf = self._local.buf = bytearray(_RECV)
        view = memoryview(buf)
        got = 0
        try:
            while not answer.complete:
                n = sock.recv_into(buf)
                if n == 0:  # the server closed: the end of an unframed body, else an answer cut short
                    if answer.status and not answer.framed:
                        answer.complete = True
                        self._drop(sock)
                        break
                    self._drop(sock)
                    raise httpx.RemoteProtocolError(
                        f"{method} {target!r}: server disconnected without sending a response" if got == 0 else
                        f"{method} {target!r}: peer closed connection without sending complete message body")
                got += n
                answer.parser.feed_data(view[:n])
        except TimeoutError as exc:
            self._drop(sock)
            raise httpx.ReadTimeout(f"{method} {target!r}: read timed out ({exc})") from exc
        except httptools.HttpParserError as exc:
            self._drop(sock)
            raise httpx.RemoteProtocolError(f"{method} {target!r}: malformed answer ({exc})") from exc
        except OSError as exc:
            self._drop(sock)
            raise httpx.ReadError(f"{method} {target!r}: {exc}") from exc
        return answer

    def _connection(self) -> socket.socket:
        """This thread's open connection; a new one when it has none, it is a parent process's, or the server closed
        it while idle (readable now, with no answer due: an EOF or bytes nobody asked for)."""
        if os.getpid() != self._pid:  # a forked child: never write on the parent's connections
            self._local, self._all, self._lock, self._pid = threading.local(), weakref.WeakSet(), threading.Lock(), \
                os.getpid()
        sock: socket.socket | None = getattr(self._local, "sock", None)
        if sock is not None:
            poll = select.poll()
            poll.register(sock, select.POLLIN)
            readable = bool(poll.poll(0))  # POLLIN, POLLHUP or POLLERR: closed or unusable
            if not readable:
                return sock
            self._drop(sock)
        try:
            sock = socket.create_connection(self.address, timeout=self.connect_timeout)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connect to {self.address[0]}:{self.address[1]} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"connect to {self.address[0]}:{self.address[1]}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one write a request: send it now
        sock.settimeout(self.timeout)
        self._local.sock = sock
        with self._lock:
            self._all.add(sock)
        return sock

    def _drop(self, sock: socket.socket) -> None:
        if getattr(self._local, "sock", None) is sock:
            self._local.sock = None
        sock.close()

    def close(self) -> None:
        """Close every thread's connection (a call after it opens a new one)."""
        with self._lock:
            socks = list(self._all)
        for sock in socks:
            sock.close()
        self._local = threading.local()
