"""Rewards from an HTTP reward server (OpenRLHF's protocol, and what `rlhf serve-rm` serves).

POST {"query": [...], "prompts": [...], "labels": [...]} -> {"rewards": [...]}, `batch_size` queries per
request (as OpenRLHF sends micro-batches: servers bound a request's size). Connection errors,
timeouts and 5xx replies are retried with exponential backoff; after the last try, or on a reply
that cannot be used, a one-line RewardError. `timeout_s` bounds each try, so a dead server never hangs a run.
"""

from __future__ import annotations

import time

import requests
import torch

from configs.errors import first_line
from stages.rewards.base import RewardBatch, as_rewards, check_batch, concat, mean_logs
from stages.rewards.errors import RewardError

# A server dropping the connection mid-reply (ChunkedEncodingError) is as transient as a refused one.
RETRYABLE = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


def snippet(text: str, limit: int = 160) -> str:
    """A reply body squeezed onto one short line (error pages are multi-line HTML)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def error_text(reply: requests.Response) -> str:
    """An error reply on one short line: its JSON `detail` when it has one (FastAPI's errors), else its body."""
    try:
        detail = reply.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return snippet(detail if isinstance(detail, str) else reply.text, limit=300)


def backoff_delays(retries: int, base_s: float) -> list[float]:
    """Waits before each retry: base, 2*base, 4*base, ..."""
    return [base_s * 2**i for i in range(retries)]


class RemoteScorer:
    def __init__(self, url: str, timeout_s: float = 10.0, retries: int = 3, backoff_s: float = 0.2,
                 batch_size: int = 32) -> None:
        self.url, self.timeout_s, self.retries, self.backoff_s = url, timeout_s, retries, backoff_s
        self.batch_size = batch_size
        self.session = requests.Session()

    def post(self, payload: dict) -> dict:
        """The server's JSON reply, retrying transient failures."""
        delays = backoff_delays(self.retries, self.backoff_s)
        last = ""
        for attempt in range(self.retries + 1):
            try:
                reply = self.session.post(self.url, json=payload, timeout=self.timeout_s)
            except RETRYABLE as exc:
                last = f"{type(exc).__name__}: {first_line(exc)[:160]}"
            except requests.RequestException as exc:  # a bad URL and the like: retrying cannot help
                raise RewardError(f"reward server {self.url}: {type(exc).__name__}: {first_line(exc)}") from None
            else:
                if reply.status_code < 500:
                    return self._json(reply)
                last = f"HTTP {reply.status_code}: {snippet(reply.text)}"
            if attempt < self.retries:
                time.sleep(delays[attempt])
        tries = self.retries + 1
        raise RewardError(f"reward server {self.url}: failed after {tries} {'try' if tries == 1 else 'tries'} (last error: {last})")

    def _json(self, reply: requests.Response) -> dict:
        if reply.status_code >= 400:  # a client error will not go away by retrying
            hint = f"; lower reward.batch_size (now {self.batch_size} queries a request)" if reply.status_code == 413 else ""
            raise RewardError(f"reward server {self.url}: HTTP {reply.status_code}: {error_text(reply)}{hint}")
        try:
            body = reply.json()
        except ValueError:
            raise RewardError(f"reward server {self.url}: reply is not JSON ({snippet(reply.text)!r})") from None
        if not isinstance(body, dict) or "rewards" not in body:
            raise RewardError(f"reward server {self.url}: reply has no 'rewards' (got {snippet(str(body))})")
        return body

    def score(self, prompts: list[str], responses: list[str], labels: list[str | None]) -> RewardBatch:
        check_batch(prompts, responses, labels)
        parts, where = [], f"reward server {self.url}"
        for start in range(0, len(prompts), self.batch_size):
            batch = slice(start, start + self.batch_size)
            queries = [p + r for p, r in zip(prompts[batch], responses[batch])]
            body = self.post({"query": queries, "prompts": prompts[batch], "labels": labels[batch]})
            parts.append(RewardBatch(rewards=as_rewards(body["rewards"], len(queries), where),
                                     extra_logs=mean_logs(body.get("extra_logs"), where)))
        return concat(parts) if parts else RewardBatch(rewards=torch.zeros(0))
