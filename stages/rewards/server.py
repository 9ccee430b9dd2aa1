"""An HTTP reward server over `RewardModelScorer` (`rlhf serve-rm`), speaking OpenRLHF's protocol:
POST /get_reward {"query": [...]} -> {"rewards": [...], "scores": [...]}; GET /health.

Concurrent requests take turns on the model batch by batch, and a body over `max_request_bytes` is
answered 413 at once (unread when it declares its length), so no request holds the server for long."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from stages.rewards.reward_model import RewardModelScorer

MAX_REQUEST_MB = 1.0  # clients send micro-batches (the pipeline: reward.batch_size queries a request)


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
        detail = (f"request body {body_is} over this server's limit of {self.max_bytes} bytes (rlhf serve-rm "
                  "--max-request-mb); send fewer queries per request")
        body = json.dumps({"detail": detail}).encode()
        # the body the client is still sending is not read: close the connection rather than wait for it
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def make_app(scorer: RewardModelScorer, max_request_bytes: int = int(MAX_REQUEST_MB * 2**20)) -> FastAPI:
    app = FastAPI(title="rlhf reward model")
    # One forward pass at a time, in a worker thread; asyncio's lock is first come, first served, so
    # concurrent requests take turns batch by batch and a small one never waits out a large one.
    turn = asyncio.Lock()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "models": scorer.paths}

    @app.post("/get_reward")
    async def get_reward(request: RewardRequest) -> dict:
        rewards = []
        for start in range(0, len(request.query), scorer.batch_size):
            async with turn:
                batch = await run_in_threadpool(scorer.score_queries, request.query[start : start + scorer.batch_size])
            rewards += batch.tolist()
        return {"rewards": rewards, "scores": rewards}

    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    return app


def serve(model_path: str | Path, host: str = "127.0.0.1", port: int = 5001, batch_size: int = 32,
          max_request_mb: float = MAX_REQUEST_MB) -> None:
    """Load the RM, then serve it until interrupted."""
    import uvicorn

    app = make_app(RewardModelScorer([model_path], batch_size=batch_size), int(max_request_mb * 2**20))
    print(f"reward server on http://{host}:{port}/get_reward ({model_path}; requests up to {max_request_mb:g} MiB)",
          flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
