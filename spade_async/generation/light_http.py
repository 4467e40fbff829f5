"""One HTTP request on an httpx client's own transport, past the client's per-request layers.

``httpx.AsyncClient.request`` builds the request (merging the client's headers, cookies and
params), runs the auth and redirect flows, and extracts cookies from every reply through
``http.cookiejar`` (a ``urllib`` request and response built for each). An SGLang engine
sets no cookie, needs no auth and never redirects, and the generation client sends ~5,000
requests a step at the paper's scale: without those layers the controller's loop CPU fell
to x0.75-0.87 (``bench/results/simulate_scale_ab_http.json``, ``docs/controller-cpu.md``).

``send`` builds the ``httpx.Request`` itself and hands it to the transport the client would
pick for that URL (its mounts and proxy settings kept), with the client's timeouts, reads
the whole body and closes the stream. What it gives up, on purpose: the client's default
headers, cookies and auth (the generation client sets none), redirects (a 3xx reply comes
back as it is, and the caller's status check refuses it) and httpx's per-request log line.
"""

from __future__ import annotations

import httpx

__all__ = ["send", "JSON_HEADERS"]

JSON_HEADERS = {"content-type": "application/json"}


async def send(
    client: httpx.AsyncClient, method: str, url: httpx.URL, content: bytes | None
) -> httpx.Response:
    """``method url`` with ``content`` (JSON when given) on ``client``'s transport for
    ``url``; the reply read whole (``.content``) and closed. Transport failures raise what
    the client's ``request`` raises (``httpx.TransportError`` and its kinds)."""
    request = httpx.Request(
        method,
        url,
        content=content,
        headers=JSON_HEADERS if content is not None else None,
        extensions={"timeout": client.timeout.as_dict()},
    )
    transport = client._transport_for_url(url)  # noqa: SLF001  (httpx's own choice of transport)
    response = await transport.handle_async_request(request)
    response.request = request
    try:
        await response.aread()
    finally:
        await response.aclose()
    return response
