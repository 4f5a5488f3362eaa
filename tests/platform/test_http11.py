"""The client's short path over a socket (`shared.http11`): a service reached by URL gets the request httpx's client
would send, on one kept-alive connection per thread, and every way a server can fail it maps to httpx's exceptions,
so the retry rules are the ones httpx's client had. Real uvicorn for the app side; a scripted raw TCP server for the
answers uvicorn never gives (chunks, a close without notice, an answer cut short, garbage)."""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from shared.client import IDEMPOTENCY_HEADER, ServiceClient, ServiceClients
from shared.errors import NotFound, UpstreamError
from shared.http11 import HTTP11Connections
from shared.logging import RUN_ID_HEADER, bind_run_id
from shared.settings import Settings
from tests.platform.conftest import free_port, serve_in_thread


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy in the environment keeps httpx's client (tested below): these tests want the socket path."""
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def _settings(tmp_path: Path, port: int, **kw: Any) -> Settings:
    base: dict[str, Any] = {"results_dir": tmp_path, "http_retries": 2, "http_backoff_s": 0.0,
                            "thermal_url": f"http://127.0.0.1:{port}"}
    base.update(kw)
    return Settings.model_validate(base)


def _recording_app(seen: list[dict[str, Any]]) -> Starlette:
    async def handler(request: Request) -> Response:
        scope = request.scope
        seen.append({"path": scope["path"], "raw_path": scope["raw_path"], "query": scope["query_string"],
                     "server": tuple(scope["server"]), "client": tuple(scope["client"]),
                     "headers": sorted((k, v) for k, v in scope["headers"] if k != IDEMPOTENCY_HEADER.lower().encode()),
                     "body": await request.body()})
        return JSONResponse({"ok": True, "n": len(seen)})

    async def missing(request: Request) -> Response:
        return JSONResponse({"error": {"code": "nope", "message": "no such thing", "field": "id"}}, status_code=404)

    return Starlette(routes=[Route("/v1/missing", missing), Route("/v1/{rest:path}", handler, methods=["GET", "POST"])])


def test_socket_requests_reach_the_app_as_httpx_would_send_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """The same calls through httpx's client and through the short path: the app sees the same method, path, query,
    headers and body; the short path keeps one connection for all of them, and only a path httpx would quote goes
    through httpx's client."""
    seen: list[dict[str, Any]] = []
    port = free_port()
    settings = _settings(tmp_path, port)
    short = ServiceClients(settings)["thermal"]
    assert short._socket is not None
    reference = ServiceClient("thermal", f"http://127.0.0.1:{port}", settings)
    reference._socket = None  # httpx's client, as before the short path

    def calls(client: ServiceClient) -> None:
        with bind_run_id("run-7"):
            assert client.post_json("/v1/thing", {"x": [1, 2]}, params={"start": 3, "count": 16},
                                    headers={"X-Extra": "yes", "accept": "application/json"})["ok"] is True
            assert client.get_json("/v1/models/a%2Fb/thing", params={"a": "b c&d"})["ok"] is True
            assert client.post_json("/v1/with space")["ok"] is True  # quoted by httpx: its own request
            assert client.post_json("/v1/empty")["ok"] is True  # no body: Content-Length 0, as httpx sends it
            assert client.get_json("/v1/list", params={"k": [1, 2], "flag": True, "none": None})["ok"] is True
            assert client.post_json("/v1/big", {"x": "y" * 300_000})["ok"] is True  # more than one recv / send

    sent: list[str] = []
    real_send = httpx.Client.send

    def counting_send(self: httpx.Client, request: httpx.Request, **kw: Any) -> httpx.Response:
        sent.append(request.url.path)
        return real_send(self, request, **kw)

    with serve_in_thread(_recording_app(seen), port):
        monkeypatch.setattr(httpx.Client, "send", counting_send)
        calls(short)
        assert sent == ["/v1/with space"]
        calls(reference)
        with pytest.raises(NotFound, match="no such thing"):  # errors map as before
            short.get_json("/v1/missing")
        with pytest.raises(UnicodeEncodeError):  # header values are ASCII, as httpx wants them
            short.get_json("/v1/thing", headers={"X-Name": "r\u00e9"})
    assert len(seen) == 12

    def same(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k != "client"}

    assert [same(d) for d in seen[:6]] == [same(d) for d in seen[6:]]
    post = dict(seen[0]["headers"])
    assert post[b"host"] == f"127.0.0.1:{port}".encode() and post[b"content-length"] == b"11"
    assert post[RUN_ID_HEADER.lower().encode()] == b"run-7" and post[b"user-agent"].startswith(b"python-httpx/")
    assert seen[1]["raw_path"] == b"/v1/models/a%2Fb/thing" and seen[1]["query"] == b"a=b+c%26d"
    assert seen[5]["body"] == b'{"x":"' + b"y" * 300_000 + b'"}'
    short_path = [seen[i]["client"] for i in (0, 1, 3, 4, 5)]
    assert len(set(short_path)) == 1  # one kept-alive connection for every call of the short path
    short.close()
    reference.close()


def test_each_thread_keeps_its_own_connection(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    port = free_port()
    client = ServiceClients(_settings(tmp_path, port))["thermal"]
    with serve_in_thread(_recording_app(seen), port):
        def work() -> None:
            for _ in range(5):
                client.get_json("/v1/thing")

        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(seen) == 15
    by_conn: dict[tuple[str, int], int] = {}
    for d in seen:
        by_conn[d["client"]] = by_conn.get(d["client"], 0) + 1
    assert sorted(by_conn.values()) == [5, 5, 5]
    client.close()


def test_a_proxy_in_the_environment_keeps_httpx_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServiceClients(_settings(tmp_path, free_port()))["thermal"]._socket is not None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert ServiceClients(_settings(tmp_path, free_port()))["thermal"]._socket is None
    monkeypatch.delenv("HTTP_PROXY")
    # a base URL with a path (behind a prefix), https or credentials (httpx sends them as Basic auth) stays with
    # httpx's client
    s = _settings(tmp_path, 1)
    assert ServiceClient("thermal", "http://127.0.0.1:1/prefix/", s)._socket is None
    assert ServiceClient("thermal", "https://127.0.0.1:1", s)._socket is None
    assert ServiceClient("thermal", "http://user:pw@127.0.0.1:1", s)._socket is None


Answer = Callable[[socket.socket, bytes], bool]  # writes an answer to the request; False: close the connection


class RawServer:
    """A loopback TCP server that answers each request (head + Content-Length body) with the next scripted answer
    (then 200 with ``{"ok":true}``) and records (connection number, request bytes)."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.requests: list[tuple[int, bytes]] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self._conns = 0
        self._threads: list[threading.Thread] = []

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns += 1
            t = threading.Thread(target=self._handle, args=(conn, self._conns), daemon=True)
            t.start()
            self._threads.append(t)

    def _handle(self, conn: socket.socket, n: int) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(rest) < length:
                    rest += conn.recv(65536)
                req, buf = head + b"\r\n\r\n" + rest[:length], rest[length:]
                self.requests.append((n, req))
                answer = self.answers.pop(0) if self.answers else _ok()
                if not answer(conn, req):
                    return


def _ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> Answer:
    def answer(conn: socket.socket, req: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
                     % (len(body), extra, body))
        return b"connection: close" not in extra.lower()
    return answer


def _raw(data: bytes, *, keep: bool = False) -> Answer:
    def answer(conn: socket.socket, req: bytes) -> bool:
        conn.sendall(data)
        return keep
    return answer


@contextmanager
def raw_server(answers: list[Answer]) -> Iterator[RawServer]:
    server = RawServer(answers)
    t = threading.Thread(target=server.serve, daemon=True)
    t.start()
    try:
        yield server
    finally:
        with contextlib.suppress(OSError):
            server.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept
        server.sock.close()


def test_chunked_and_closing_answers(tmp_path: Path) -> None:
    chunked = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
               b"5\r\n{\"ok\"\r\n6\r\n:\"ch\"}\r\n0\r\n\r\n")
    unframed = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{\"ok\":\"eof\"}"
    with raw_server([_raw(chunked, keep=True), _ok(extra=b"Connection: close\r\n"), _raw(unframed)]) as srv:
        client = ServiceClients(_settings(tmp_path, srv.port))["thermal"]
        assert client.get_json("/v1/a") == {"ok": "ch"}
        assert client.get_json("/v1/b") == {"ok": True}  # the server said it closes: the next call reconnects
        assert client.get_json("/v1/c") == {"ok": "eof"}  # no length: the body runs to the close
        assert client.get_json("/v1/d") == {"ok": True}
    assert [n for n, _ in srv.requests] == [1, 1, 2, 3]
    first = srv.requests[0][1]
    assert first.startswith(b"GET /v1/a HTTP/1.1\r\n") and f"host: 127.0.0.1:{srv.port}".encode() in first


def test_a_connection_the_server_closed_while_idle_is_replaced_without_a_retry(tmp_path: Path) -> None:
    """The server closes after its answer without saying so (a keep-alive timeout): the next call sees the closed
    connection before writing on it and opens a new one; nothing is sent twice."""
    closing = _ok()

    def answer_then_close(conn: socket.socket, req: bytes) -> bool:
        closing(conn, req)
        return False

    with raw_server([answer_then_close]) as srv:
        client = ServiceClients(_settings(tmp_path, srv.port, http_retries=0))["thermal"]
        assert client.post_json("/v1/a", {"x": 1}) == {"ok": True}
        sock = client._socket._local.sock if client._socket is not None else None
        assert sock is not None
        poll = select.poll()
        poll.register(sock, select.POLLIN)
        assert poll.poll(5000)  # the server's close has reached the client
        assert client.post_json("/v1/b", {"x": 2}) == {"ok": True}
    assert [n for n, _ in srv.requests] == [1, 2]


def test_a_connection_idle_past_the_keepalive_expiry_is_replaced(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection unused for longer than `KEEPALIVE_S` is closed before the next call (a peer gone without a word
    would otherwise cost a whole read timeout), as httpx's keep-alive expiry does; a busy one is kept."""
    from shared import http11

    monkeypatch.setattr(http11, "KEEPALIVE_S", 0.2)
    with raw_server([]) as srv:
        client = ServiceClients(_settings(tmp_path, srv.port, http_retries=0))["thermal"]
        assert client.get_json("/v1/a") == {"ok": True}
        assert client.get_json("/v1/b") == {"ok": True}
        time.sleep(0.3)
        assert client.get_json("/v1/c") == {"ok": True}
    assert [n for n, _ in srv.requests] == [1, 1, 2]


def test_an_interrupted_call_never_leaves_its_answer_to_the_next(tmp_path: Path) -> None:
    """A call interrupted while it waits (a Celery task's soft time limit is a signal) closes its connection: the
    next call gets its own answer, never the late one of the call before."""
    class SoftLimit(Exception):
        pass

    def late(conn: socket.socket, req: bytes) -> bool:
        time.sleep(0.5)
        return _ok(b'{"ok":"late"}')(conn, req)

    def on_alarm(signum: int, frame: Any) -> None:
        raise SoftLimit

    with raw_server([late]) as srv:
        client = ServiceClients(_settings(tmp_path, srv.port, http_retries=0))["thermal"]
        old = signal.signal(signal.SIGALRM, on_alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            with pytest.raises(SoftLimit):
                client.get_json("/v1/first")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        time.sleep(0.6)  # the late answer has been sent on the old connection
        assert client.get_json("/v1/second") == {"ok": True}
    assert [n for n, _ in srv.requests] == [1, 2]


def test_bytes_after_the_answer_close_the_connection(tmp_path: Path) -> None:
    """An answer followed by bytes nobody asked for (a second message): the answer is the first message alone, and
    the connection is not used again."""
    two = (b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"
           b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n{\"ok\":false}")
    with raw_server([_raw(two, keep=True)]) as srv:
        client = ServiceClients(_settings(tmp_path, srv.port, http_retries=0))["thermal"]
        r = client.request("GET", "/v1/a")
        assert r.json() == {"ok": True} and r.headers.get_list("content-length") == ["11"]
        assert client.get_json("/v1/b") == {"ok": True}
    assert [n for n, _ in srv.requests] == [1, 2]


@pytest.mark.parametrize("answer, message", [
    (_raw(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"ok\""), "without sending complete message body"),
    (_raw(b""), "server disconnected without sending a response"),
    (_raw(b"NOT HTTP AT ALL\r\n\r\n"), "malformed answer"),
    (_raw(b"HTTP/1.1 100 Continue\r\n\r\n"), "without sending complete message body"),  # an interim answer only
])
def test_broken_answers_are_retried_with_the_same_key_then_fail_clearly(tmp_path: Path, answer: Answer,
                                                                        message: str) -> None:
    with raw_server([answer, answer, answer]) as srv:
        client = ServiceClients(_settings(tmp_path, srv.port, http_retries=2))["thermal"]
        with pytest.raises(UpstreamError, match=f"thermal: unreachable after 3 attempts: .*{message}"):
            client.post_json("/v1/a", {"x": 1}, idempotency_key="k-9")
    assert len(srv.requests) == 3 and len({n for n, _ in srv.requests}) == 3
    assert all(b"idempotency-key: k-9" in req.lower() for _, req in srv.requests)
    with raw_server([answer]) as srv:  # one broken answer, then a good one: the retry succeeds
        client = ServiceClients(_settings(tmp_path, srv.port, http_retries=2))["thermal"]
        assert client.post_json("/v1/a", {"x": 1}) == {"ok": True}
    assert len(srv.requests) == 2


def test_interim_answers_are_skipped(tmp_path: Path) -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"
    with raw_server([_raw(interim, keep=True)]) as srv:
        client = ServiceClients(_settings(tmp_path, srv.port))["thermal"]
        assert client.get_json("/v1/a") == {"ok": True}
        assert client.get_json("/v1/b") == {"ok": True}
    assert [n for n, _ in srv.requests] == [1, 1]


def test_a_forked_child_never_writes_on_its_parents_connection() -> None:
    """After a fork (the Celery pool) the child's first call opens its own connection; the parent's stays open."""
    with raw_server([]) as srv:
        conns = HTTP11Connections("127.0.0.1", srv.port, connect_timeout=1.0, timeout=5.0)
        req = [(b"host", b"x")]
        assert conns.call("GET", b"/a", req, b"")[0] == 200
        parent = conns._local.sock
        conns._pid = -1  # what the child sees: another process's connections
        assert conns.call("GET", b"/b", req, b"")[0] == 200
        assert conns._local.sock is not parent and parent.fileno() != -1
        conns.close()
    assert [n for n, _ in srv.requests] == [1, 2]


def test_timeouts_and_refusals_map_to_httpx_exceptions() -> None:
    port = free_port()
    conns = HTTP11Connections("127.0.0.1", port, connect_timeout=0.5, timeout=0.2)
    with pytest.raises(httpx.ConnectError):
        conns.call("GET", b"/a", [(b"host", b"x")], b"")

    def silent(conn: socket.socket, req: bytes) -> bool:
        threading.Event().wait(1.0)
        return False

    with raw_server([silent]) as srv:
        conns = HTTP11Connections("127.0.0.1", srv.port, connect_timeout=0.5, timeout=0.2)
        with pytest.raises(httpx.ReadTimeout):
            conns.call("GET", b"/a", [(b"host", b"x")], b"")


def test_an_answer_before_the_server_closes_on_a_body_is_read() -> None:
    """A server that answers (413) before reading a large body and closes: the write fails, the answer is read
    anyway and returned (httpcore does the same), not a write error."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = int(srv.getsockname()[1])

    def serve() -> None:
        conn, _ = srv.accept()
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 9\r\nconnection: close\r\n\r\n{\"e\":413}")
        conn.close()  # the unread body: the client's write fails

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    conns = HTTP11Connections("127.0.0.1", port, connect_timeout=1.0, timeout=5.0)
    big = b"y" * (16 << 20)
    status, _, body = conns.call("POST", b"/x", [(b"host", b"x"), (b"content-length", b"%d" % len(big))], big)
    t.join(timeout=5)
    srv.close()
    assert (status, body) == (413, b'{"e":413}')


@pytest.mark.parametrize("header", [{"X-A": "a\r\nX-B: b"}, {"X-A": "trailing "}, {"X-A": "\tlead"},
                                    {"X-A": "a\x0bb"}, {"X A": "b"}, {"X:A": "b"}])
def test_a_header_h11_would_refuse_is_refused_as_httpx_refuses_it(tmp_path: Path, header: dict[str, str]) -> None:
    """h11's rules (a name is a token; a value is visible characters separated by spaces or tabs, nothing that
    could end the header and start another): the same error through both paths, and nothing reaches the server."""
    with raw_server([]) as srv:
        client = ServiceClients(_settings(tmp_path, srv.port))["thermal"]
        reference = ServiceClient("thermal", f"http://127.0.0.1:{srv.port}", client.settings)
        reference._socket = None
        errors = []
        for c in (client, reference):
            with pytest.raises(UpstreamError) as info:
                c.get_json("/v1/a", headers=header)
            errors.append(str(info.value))
    assert srv.requests == []
    assert errors[0].lower() == errors[1].lower() and "Illegal header" in errors[0]  # names go lower-case here


def test_a_write_cut_off_without_an_answer_is_retried(tmp_path: Path) -> None:
    """A server that closes on an unread body without answering: the failed write is followed by a read that meets
    the close, a `RemoteProtocolError` as in httpx's client, so the call is retried (and succeeds)."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = int(srv.getsockname()[1])
    seen: list[int] = []

    def serve() -> None:
        for n in range(2):
            conn, _ = srv.accept()
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(65536)
            seen.append(n)
            if n == 0:
                conn.close()  # the body unread, no answer
                continue
            length = int(buf.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            rest = len(buf.split(b"\r\n\r\n", 1)[1])
            while rest < length:
                rest += len(conn.recv(1 << 20))
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{\"ok\":true}")
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client = ServiceClients(_settings(tmp_path, port, http_retries=1))["thermal"]
    try:
        assert client.post_json("/v1/a", {"x": "y" * (16 << 20)}) == {"ok": True}
    finally:
        t.join(timeout=10)
        srv.close()
    assert seen == [0, 1]


def test_head_stays_with_httpx_client(tmp_path: Path) -> None:
    """A HEAD answer announces a body it does not send: the socket path's parser would wait for it, so HEAD goes
    through httpx's client (which knows), and answers at once."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n"
    with raw_server([_raw(head, keep=True)]) as srv:
        client = ServiceClients(_settings(tmp_path, srv.port, http_read_timeout_s=2.0, http_retries=0))["thermal"]
        assert client.request("HEAD", "/v1/a").status_code == 200
    assert srv.requests[0][1].startswith(b"HEAD /v1/a HTTP/1.1\r\n")
