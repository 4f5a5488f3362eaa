"""HTTP/1.1 over kept-alive TCP connections, for `shared.client.ServiceClient`'s calls to a service in the cluster.

httpx's client spends ~0.25 ms of CPU on a call before and after the socket (its URL, request and response objects,
the cookie jar, httpcore's connection pool and h11's pure-Python parser): 270 µs of client CPU against 17 µs for the
same POST of 30 kB written with one ``sendall`` and its answer parsed by httptools (the C parser uvicorn uses), on
loopback (/tmp microbenchmark, 2026-11-28). A window makes three such calls. This module is that short path: one
connection per calling thread and service, reused while the server keeps it open, the request written in one piece,
the answer parsed by ``httptools.HttpResponseParser`` (Content-Length, chunked, or up to the server's close).

Failures are httpx's exceptions, as httpx's client raises them, so the caller's retry rules do not change: a refused
or unreachable connect is ``ConnectError``, a connect that takes longer than its timeout ``ConnectTimeout``, a send or
read past the timeout ``WriteTimeout`` / ``ReadTimeout``, a reset ``ReadError``, an answer cut short or malformed
``RemoteProtocolError``; a write that fails is followed by a read, whose answer (a 413 sent before the server closed)
or error counts, as in httpcore. A connection the server has closed while it sat idle (uvicorn's keep-alive
timeout: 5 s) is noticed before it is reused (readable while no answer is due), as httpcore does, and replaced; so is
one idle longer than `KEEPALIVE_S` (httpx's keep-alive expiry: a peer gone without a word would cost a read timeout).
A call interrupted or failed midway closes its connection (its answer may still come). Header names and values follow
h11's rules, with its ``LocalProtocolError``.
"""

from __future__ import annotations

import os
import re
import select
import socket
import threading
import time
import weakref

import httptools
import httpx

_RECV = 1 << 18  # bytes read per recv: a window's answers are 10-60 kB
KEEPALIVE_S = 5.0  # a connection idle longer is closed before the next call, as httpx's keepalive_expiry (5 s) does
# h11's rules (httpx's client): a name is a token; a value is runs of visible characters separated by spaces or tabs
_NAME = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_VALUE = re.compile(rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?")


class _Answer:
    """httptools' callbacks for one response: status, headers (lower-case names, as received), body parts."""

    __slots__ = ("body", "complete", "extra", "framed", "headers", "keep_alive", "parser", "status")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.complete = False
        self.framed = False  # a Content-Length or Transfer-Encoding: else the body runs to the server's close
        self.keep_alive = False  # the connection stays open after this answer (read before the parser resets)
        self.extra = False  # bytes of another message came after this answer: nothing asked for them

    def on_message_begin(self) -> None:
        if self.complete:
            self.extra = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete:
            return
        low = name.lower()
        if low in (b"content-length", b"transfer-encoding"):
            self.framed = True
        self.headers.append((low, value))

    def on_headers_complete(self) -> None:
        if not self.complete:
            self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.complete:
            return
        if self.status < 200:  # an interim answer (1xx): the real one follows on the same connection
            self.status, self.headers, self.body, self.framed = 0, [], [], False
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
        for name, value in headers:  # h11's rules, its message: no header may end early and start another
            if not _NAME.fullmatch(name):
                raise httpx.LocalProtocolError(f"Illegal header name {name!r}")
            if not _VALUE.fullmatch(value):
                raise httpx.LocalProtocolError(f"Illegal header value {value!r}")
        sock = self._connection()
        head = b"".join((method.encode("ascii"), b" ", target, b" HTTP/1.1\r\n",
                         *(b"%s: %s\r\n" % kv for kv in headers), b"\r\n"))
        sent = False
        try:
            try:
                sock.sendall(head + body if body else head)
                sent = True
            except TimeoutError as exc:
                raise httpx.WriteTimeout(f"{method} {target!r}: send timed out ({exc})") from exc
            except OSError:  # the server may have answered before it closed (a 413 for a body too large): read it,
                pass  # or raise what the read meets, as httpcore does
            answer = self._read(sock, method, target)
        except BaseException:  # an error, or an interrupt (a task's time limit) mid-call: the answer may still come
            self._drop(sock)
            raise
        if sent and answer.keep_alive and not answer.extra:
            self._local.used = time.monotonic()
        else:
            self._drop(sock)
        return answer.status, answer.headers, b"".join(answer.body)

    def _read(self, sock: socket.socket, method: str, target: bytes) -> _Answer:
        """The answer on ``sock``, or httpx's exception for what went wrong (the caller closes the connection)."""
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
                        answer.complete = True  # keep_alive stays False: the caller closes its side
                        break
                    raise httpx.RemoteProtocolError(
                        f"{method} {target!r}: server disconnected without sending a response" if got == 0 else
                        f"{method} {target!r}: peer closed connection without sending complete message body")
                got += n
                answer.parser.feed_data(view[:n])
        except TimeoutError as exc:
            raise httpx.ReadTimeout(f"{method} {target!r}: read timed out ({exc})") from exc
        except httptools.HttpParserError as exc:
            raise httpx.RemoteProtocolError(f"{method} {target!r}: malformed answer ({exc})") from exc
        except OSError as exc:
            raise httpx.ReadError(f"{method} {target!r}: {exc}") from exc
        return answer

    def _connection(self) -> socket.socket:
        """This thread's open connection; a new one when it has none, it is a parent process's, or the server closed
        it while idle (readable now, with no answer due: an EOF or bytes nobody asked for)."""
        if os.getpid() != self._pid:  # a forked child: never write on the parent's connections
            self._local, self._all, self._lock, self._pid = threading.local(), weakref.WeakSet(), threading.Lock(), \
                os.getpid()
        sock: socket.socket | None = getattr(self._local, "sock", None)
        if sock is not None and time.monotonic() - getattr(self._local, "used", 0.0) > KEEPALIVE_S:
            self._drop(sock)  # idle too long: its peer may be gone without a word (a replaced pod, a NAT entry)
            sock = None
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
