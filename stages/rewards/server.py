"""An HTTP reward server over `RewardModelScorer` (`rlhf serve-rm`), speaking OpenRLHF's protocol:
POST /get_reward {"query": [...]} -> {"rewards": [...], "scores": [...]}; GET /health."""

from __future__ import annotations

import threading
from pathlib import Path

from fastapi import FastAPI
from pydantic import BaseModel

from stages.rewards.reward_model import RewardModelScorer


class RewardRequest(BaseModel):
    query: list[str]
    prompts: list[str] | None = None  # accepted for protocol compatibility; an RM needs only the queries
    labels: list[str | None] | None = None


def make_app(scorer: RewardModelScorer) -> FastAPI:
    app = FastAPI(title="rlhf reward model")
    lock = threading.Lock()  # sync endpoints run in a thread pool; one forward pass at a time

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "models": scorer.paths}

    @app.post("/get_reward")
    def get_reward(request: RewardRequest) -> dict:
        with lock:
            rewards = scorer.score_queries(request.query).tolist()
        return {"rewards": rewards, "scores": rewards}

    return app


def serve(model_path: str | Path, host: str = "127.0.0.1", port: int = 5001, batch_size: int = 32) -> None:
    """Load the RM, then serve it until interrupted."""
    import uvicorn

    app = make_app(RewardModelScorer([model_path], batch_size=batch_size))
    print(f"reward server on http://{host}:{port}/get_reward ({model_path})", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
