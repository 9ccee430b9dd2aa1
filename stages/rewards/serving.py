"""What `rlhf serve-rm` and its clients agree on, without torch (the CLI reads it to build its options): the
variable that holds the bearer token, and the server's default limits per request."""

from __future__ import annotations

from dataclasses import dataclass

TOKEN_ENV = "RLHF_REWARD_TOKEN"  # the bearer token's variable, read by the remote client and by `rlhf serve-rm`


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server; over any, it is answered 413 (503 for the line)."""

    max_request_bytes: int = 2**20  # clients send micro-batches (the pipeline: reward.batch_size queries a request)
    max_queries: int = 512  # queries in one request
    max_query_chars: int = 65536  # characters of one query: its tokenizing, inside the model's turn, stays short
    max_waiting: int = 64  # requests in line for the model before the next is turned away
