"""Rewards from an HTTP reward server (OpenRLHF's protocol, and what `rlhf serve-rm` serves).

POST {"query": [...], "prompts": [...], "labels": [...]} -> {"rewards": [...]}, `batch_size` queries per
request (as OpenRLHF sends micro-batches: servers bound a request's size). With `RLHF_REWARD_TOKEN` set, each
request carries it as a bearer token (`rlhf serve-rm` started with the same variable checks it).

Each try has a deadline, `timeout_s`: the reply must begin within it and be read whole by then (a server that
trickles bytes cannot hold a run), and at most `MAX_REPLY_BYTES` are read. A refused connection or a 5xx reply
is retried after a jittered, growing wait; a try that reached the server and ran out of time is not re-sent
(a slow server is not sent more work). After the last try, or on a reply that cannot be used, a one-line
RewardError.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable

import requests
import torch
import urllib3

from configs.errors import RewardError, first_line
from configs.redaction import redacted
from stages.rewards.base import RewardBatch, as_rewards, check_batch, concat, mean_logs
from stages.rewards.serving import TOKEN_ENV

MAX_REPLY_BYTES = 16 * 2**20  # rewards for one request's queries are a few KB of JSON
READ_BYTES = 65536
# Tries that never reached the server, or that it answered 5xx, are worth another; a dropped reply
# (ChunkedEncodingError) as well.
RETRYABLE = (requests.ConnectionError, requests.exceptions.ChunkedEncodingError, urllib3.exceptions.ProtocolError)
TIMED_OUT = (requests.ReadTimeout, urllib3.exceptions.ReadTimeoutError, TimeoutError)


class ReplyTooLarge(Exception):
    pass


def snippet(text: str, limit: int = 160) -> str:
    """A reply body squeezed onto one short line (error pages are multi-line HTML)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def error_text(text: str) -> str:
    """An error reply on one short line: its JSON `detail` when it has one (FastAPI's errors), else its body."""
    try:
        detail = json.loads(text).get("detail")
    except (ValueError, AttributeError):
        detail = None
    return snippet(detail if isinstance(detail, str) else text, limit=300)


def backoff_delays(retries: int, base_s: float, rng: random.Random | None = None) -> list[float]:
    """Waits before each retry: base, 2*base, 4*base, ..., each times a random factor in [0.5, 1.5) so that
    clients refused together do not come back together."""
    rng = rng or random.Random()
    return [base_s * 2**i * (0.5 + rng.random()) for i in range(retries)]


def bearer_headers() -> dict[str, str]:
    token = os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def read_by(reply: requests.Response, deadline: float, limit: int) -> bytes:
    """The reply's body, read as it arrives until `deadline` (time.monotonic) and up to `limit` bytes; TimeoutError
    past the deadline, ReplyTooLarge past the limit."""
    sock = getattr(reply.raw.connection, "sock", None)
    body = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"reply not whole after {len(body)} bytes")
        if sock is not None:
            sock.settimeout(left)  # each wait for bytes ends by the deadline, however slowly they come
        chunk = reply.raw.read1(READ_BYTES, decode_content=True)
        if not chunk:
            return bytes(body)
        body += chunk
        if len(body) > limit:
            raise ReplyTooLarge(f"reply over {limit} bytes")


class RemoteScorer:
    def __init__(self, url: str, timeout_s: float = 10.0, retries: int = 3, backoff_s: float = 0.2,
                 batch_size: int = 32, sleep: Callable[[float], None] = time.sleep) -> None:
        self.url, self.timeout_s, self.retries, self.backoff_s = url, timeout_s, retries, backoff_s
        self.sleep = sleep  # each wait before a retry goes through it (a test records the waits asked for)
        self.shown = redacted(url)  # how errors name it: a password in the URL stays out of them
        self.batch_size = batch_size
        self.session = requests.Session()

    def post(self, payload: dict) -> dict:
        """The server's JSON reply, retrying what is worth retrying."""
        delays = backoff_delays(self.retries, self.backoff_s)
        last = ""
        for attempt in range(self.retries + 1):
            deadline = time.monotonic() + self.timeout_s
            try:
                reply = self.session.post(self.url, json=payload, headers=bearer_headers(), stream=True,
                                          timeout=self.timeout_s)
                with reply:
                    body = read_by(reply, deadline, MAX_REPLY_BYTES)
            except TIMED_OUT as exc:
                raise RewardError(f"reward server {self.shown}: no whole reply within reward.timeout_s={self.timeout_s:g} "
                                  f"({type(exc).__name__}: {first_line(exc)[:160]}); not sent again: raise "
                                  "reward.timeout_s or make the server faster") from None
            except ReplyTooLarge as exc:
                raise RewardError(f"reward server {self.shown}: {exc}; a reply holds rewards for reward.batch_size "
                                  f"(now {self.batch_size}) queries") from None
            except RETRYABLE as exc:
                last = f"{type(exc).__name__}: {first_line(exc)[:160]}"
            except requests.RequestException as exc:  # a bad URL and the like: retrying cannot help
                raise RewardError(f"reward server {self.shown}: {type(exc).__name__}: {first_line(exc)}") from None
            else:
                if reply.status_code < 500:
                    return self._json(reply.status_code, body)
                last = f"HTTP {reply.status_code}: {snippet(body.decode(errors='replace'))}"
            if attempt < self.retries:
                self.sleep(delays[attempt])
        tries = self.retries + 1
        raise RewardError(f"reward server {self.shown}: failed after {tries} {'try' if tries == 1 else 'tries'} (last error: {last})")

    def _json(self, status: int, body: bytes) -> dict:
        text = body.decode(errors="replace")
        if status >= 400:  # a client error will not go away by retrying
            hint = f"; lower reward.batch_size (now {self.batch_size} queries a request)" if status == 413 else ""
            hint = f"; set {TOKEN_ENV} to the server's token" if status == 401 else hint
            raise RewardError(f"reward server {self.shown}: HTTP {status}: {error_text(text)}{hint}")
        try:
            reply = json.loads(text)
        except ValueError:
            raise RewardError(f"reward server {self.shown}: reply is not JSON ({snippet(text)!r})") from None
        if not isinstance(reply, dict) or "rewards" not in reply:
            raise RewardError(f"reward server {self.shown}: reply has no 'rewards' (got {snippet(str(reply))})")
        return reply

    def score(self, prompts: list[str], responses: list[str], labels: list[str | None]) -> RewardBatch:
        check_batch(prompts, responses, labels)
        parts, where = [], f"reward server {self.shown}"
        for start in range(0, len(prompts), self.batch_size):
            batch = slice(start, start + self.batch_size)
            queries = [p + r for p, r in zip(prompts[batch], responses[batch])]
            body = self.post({"query": queries, "prompts": prompts[batch], "labels": labels[batch]})
            parts.append(RewardBatch(rewards=as_rewards(body["rewards"], len(queries), where),
                                     extra_logs=mean_logs(body.get("extra_logs"), where)))
        return concat(parts) if parts else RewardBatch(rewards=torch.zeros(0))
