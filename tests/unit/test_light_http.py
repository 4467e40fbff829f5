"""generation/light_http.send against a real HTTP server (the standard library's, on a
socket): the same status, body and headers as ``httpx.AsyncClient.request``, the client's
timeouts and transport choice kept, and none of the client layers it skips (cookies)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import httpx
import pytest

from spade_async.generation.light_http import send

SEEN: list[dict] = []
RELEASE = threading.Event()  # lets the slow handler go once its client has timed out


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a) -> None:  # quiet
        return None

    def do_POST(self) -> None:
        n = int(self.headers.get("content-length", 0))
        body = self.rfile.read(n)
        SEEN.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if self.path == "/slow":
            RELEASE.wait(10.0)
        status = 500 if self.path == "/fail" else 200
        out = json.dumps({"echo": body.decode(), "path": self.path}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("set-cookie", "session=abc; Path=/")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        try:
            self.wfile.write(out)
        except OSError:  # the client gave up (the timeout test): nothing to answer
            pass

    def do_GET(self) -> None:
        SEEN.append({"path": self.path, "headers": dict(self.headers), "body": b""})
        self.send_response(302)
        self.send_header("location", "/elsewhere")
        self.send_header("content-length", "0")
        self.end_headers()


class Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """Quiet: the standard one prints a traceback to whatever stderr is then captured."""


@pytest.fixture(scope="module")
def server():
    srv = Server(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    RELEASE.set()
    srv.shutdown()
    srv.server_close()


def test_same_reply_as_the_client_request_and_no_cookie_kept(server):
    async def go():
        async with httpx.AsyncClient(timeout=5.0) as client:
            data = b'{"input_ids":[1,2,3]}'
            SEEN.clear()
            fast = await send(client, "POST", httpx.URL(server + "/generate"), data)
            full = await client.request(
                "POST", server + "/generate", content=data,
                headers={"content-type": "application/json"},
            )  # fmt: skip
            assert fast.status_code == full.status_code == 200
            assert fast.content == full.content
            assert json.loads(fast.content) == {"echo": data.decode(), "path": "/generate"}
            assert fast.json() == full.json() and fast.text == full.text
            # what the engine saw: the body, its length, JSON, the host
            sent = SEEN[0]
            assert sent["body"] == data
            assert sent["headers"]["content-type"] == "application/json"
            assert sent["headers"]["Content-Length"] == str(len(data))
            assert sent["headers"]["Host"] == server.removeprefix("http://")
            # the client's request kept the cookie; send never touches the jar
            assert client.cookies.get("session") == "abc"
            client.cookies.clear()
            await send(client, "POST", httpx.URL(server + "/generate"), data)
            assert not client.cookies

            bad = await send(client, "POST", httpx.URL(server + "/fail"), None)
            assert bad.status_code == 500 and bad.json()["path"] == "/fail"
            assert "content-type" not in {k.lower() for k in SEEN[-1]["headers"]}
            moved = await send(client, "GET", httpx.URL(server + "/x"), None)
            assert moved.status_code == 302  # returned as it is: never followed
            assert SEEN[-1]["path"] == "/x"

    anyio.run(go)


def test_the_clients_timeout_and_transport_errors(server):
    async def go():
        async with httpx.AsyncClient(timeout=httpx.Timeout(0.3)) as client:
            with pytest.raises(httpx.ReadTimeout):
                await send(client, "POST", httpx.URL(server + "/slow"), b"{}")
        RELEASE.set()
        async with httpx.AsyncClient(timeout=2.0) as client:
            with pytest.raises(httpx.ConnectError):  # nothing listens on port 9 here
                await send(client, "POST", httpx.URL("http://127.0.0.1:9/generate"), b"{}")

    anyio.run(go)


def test_the_transport_the_client_would_pick():
    """Mounted transports (how proxies and tests route) are the client's choice, kept."""
    hits: list[str] = []

    def mounted(request: httpx.Request) -> httpx.Response:
        hits.append(str(request.url))
        return httpx.Response(200, content=b"mounted")

    async def go():
        mounts = {"http://engine-a": httpx.MockTransport(mounted)}
        async with httpx.AsyncClient(mounts=mounts) as client:
            r = await send(client, "POST", httpx.URL("http://engine-a/generate"), b"{}")
            assert r.content == b"mounted" and hits == ["http://engine-a/generate"]

    anyio.run(go)
