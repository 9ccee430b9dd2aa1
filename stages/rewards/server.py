"""An HTTP reward server over `RewardModelScorer` (`rlhf serve-rm`), speaking OpenRLHF's protocol:
POST /get_reward {"query": [...]} -> {"rewards": [...], "scores": [...]}; GET /health.

No request holds the server for long: concurrent requests take turns on the model batch by batch; a body
over `max_request_bytes` is answered 413 at once (unread when it declares its length), as are more than
`max_queries` queries or a query over `max_query_chars` characters; beyond `max_waiting` requests in line a
request is answered 503 (the client retries later); a query longer than the model reads is cut to its end.

With a token (`RLHF_REWARD_TOKEN` in `rlhf serve-rm`'s environment) every request must carry it as a bearer
token, else 401; without one the server binds loopback only."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import os
from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from configs.errors import ConfigError
from stages.rewards.rm_scorer import RewardModelScorer
from stages.rewards.serving import TOKEN_ENV, Limits


class RewardRequest(BaseModel):
    query: list[str]
    prompts: list[str] | None = None  # accepted for protocol compatibility; an RM needs only the queries
    labels: list[str | None] | None = None


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` gets a 413 with a one-line JSON error, decided
    from Content-Length before the body is read, or as a chunked body streams past the limit."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self.reject(send, f"of {int(declared)} bytes is")
        seen, over = 0, False

        async def counted():
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    over = True
                    return {"type": "http.disconnect"}  # the app stops reading; its reply is replaced below
            return message

        async def unless_over(message) -> None:
            if not over:
                await send(message)

        await self.app(scope, counted, unless_over)
        if over:
            await self.reject(send, "is")

    async def reject(self, send, body_is: str) -> None:
        # the body the client is still sending is not read: close the connection rather than wait for it
        await send_error(send, 413, f"request body {body_is} over this server's limit of {self.max_bytes} bytes "
                                    "(rlhf serve-rm --max-request-mb); send fewer queries per request")


class BearerToken:
    """ASGI middleware: a request without `Authorization: Bearer <token>` gets a 401, decided from its headers
    before its body is read."""

    def __init__(self, app, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                return await send_error(send, 401, f"missing or wrong bearer token; the client sets {TOKEN_ENV}",
                                        [(b"www-authenticate", b"Bearer")])
        return await self.app(scope, receive, send)


async def send_error(send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """A one-line JSON error (FastAPI's `detail` shape), the connection closed after it."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def make_app(scorer: RewardModelScorer, limits: Limits | None = None, token: str | None = None) -> FastAPI:
    limits = limits or Limits()
    app = FastAPI(title="rlhf reward model")
    # One forward pass at a time, in a worker thread; asyncio's lock is first come, first served, so
    # concurrent requests take turns batch by batch and a small one never waits out a large one.
    turn = asyncio.Lock()
    waiting = 0

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "models": len(scorer.paths)}

    @app.post("/get_reward")
    async def get_reward(body: RewardRequest) -> dict:
        nonlocal waiting
        if len(body.query) > limits.max_queries:
            raise HTTPException(413, f"{len(body.query)} queries in one request, over this server's limit of "
                                     f"{limits.max_queries} (rlhf serve-rm --max-queries); send fewer per request")
        longest = max(map(len, body.query), default=0)
        if longest > limits.max_query_chars:
            raise HTTPException(413, f"a query of {longest} characters, over this server's limit of "
                                     f"{limits.max_query_chars} (rlhf serve-rm --max-query-chars)")
        if waiting >= limits.max_waiting:
            raise HTTPException(503, f"{waiting} requests are waiting for the model (rlhf serve-rm --max-waiting); "
                                     "retry later", headers={"Retry-After": "1"})
        waiting += 1
        try:
            rewards = []
            for start in range(0, len(body.query), scorer.batch_size):
                async with turn:
                    batch = await run_in_threadpool(scorer.score_queries, body.query[start : start + scorer.batch_size])
                rewards += batch.tolist()
        finally:
            waiting -= 1
        return {"rewards": rewards, "scores": rewards}

    app.add_middleware(BodyLimit, max_bytes=limits.max_request_bytes)
    if token is not None:
        app.add_middleware(BearerToken, token=token)  # added last: it runs first
    return app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def serve(model_path: str | Path, host: str = "127.0.0.1", port: int = 5001, batch_size: int = 32,
          limits: Limits | None = None) -> None:
    """Load the RM, then serve it until interrupted. Beyond loopback only with a token."""
    import uvicorn

    limits = limits or Limits()
    token = os.environ.get(TOKEN_ENV) or None
    if token is None and not is_loopback(host):
        raise ConfigError(f"rlhf serve-rm --host {host}: a server reachable from other machines needs a token; set "
                          f"{TOKEN_ENV} in its environment and in the clients', or serve on 127.0.0.1")
    app = make_app(RewardModelScorer([model_path], batch_size=batch_size), limits, token)
    print(f"reward server on http://{host}:{port}/get_reward ({model_path}; requests up to "
          f"{limits.max_request_bytes / 2**20:g} MiB, {limits.max_queries} queries; "
          f"{'bearer token required' if token else 'no token: loopback only'})", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
