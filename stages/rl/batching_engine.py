"""The `llm_engine` an agent executor's `execute` is handed (OpenRLHF's AgentExecutorBase API): `await
llm_engine.generate(prompt_token_ids, sampling_params)` gives vLLM's `RequestOutput` shape. The requests of
a rollout's concurrent episodes are answered together: a batch goes to the rollout engines once every open
episode is waiting on the engine. A batch is ordered by its prompts' tokens and settings, so which sample a
request gets does not depend on the order in which the requests arrived (from this loop or, through an HTTP
server, another thread's). An episode that also waits on something else (a tool, a sleep) for longer than
`IDLE_S` lets the others' requests go without it: those batches then depend on timing, and a rerun may
sample differently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stages.data.tokenization import decoded
from stages.rl.experience import Sample
from stages.rl.turn_params import TurnParams, read_turn_params

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IDLE_S = 1.0  # a request waits at most this long for the other open episodes' (far above an HTTP round trip)


@dataclass
class Logprob:
    logprob: float


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]
    finish_reason: str  # "stop": at EOS or a stop string; "length": out of max_tokens


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]


@dataclass
class Request:
    ids: list[int]
    params: TurnParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future = field(repr=False)


Answer = Callable[[list[list[int]], list[TurnParams], int], list[Sample]]


class BatchingEngine:
    """Runs in one event loop (`serve`), takes requests from any loop or thread (`generate`)."""

    def __init__(self, answer: Answer, tokenizer: PreTrainedTokenizerBase, defaults: TurnParams, seed: int, where: str):
        """`defaults`: the rollout's settings, whose max_new_tokens also caps what a request may ask for."""
        self.answer, self.tokenizer, self.defaults, self.seed = answer, tokenizer, defaults, seed
        self.where = where
        self.pending: list[Request] = []
        self.open = 0  # episodes not finished
        self.rounds = 0  # batches answered: each seeded apart
        self.busy = False  # the engines are answering a batch
        self.last_progress = time.monotonic()  # a request, an answer or a finished episode
        self.loop: asyncio.AbstractEventLoop | None = None
        self.changed: asyncio.Event | None = None
        self.error: BaseException | None = None  # the engines failed: every request gets it
        self.stopped = False

    def stop(self) -> None:
        """End `serve` (the rollout is over): a flag it reads, since a cancellation that meets a wake-up inside
        `asyncio.wait_for` can be lost (Python 3.11)."""
        self.stopped = True
        if self.changed is not None:
            self.changed.set()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop `serve` runs in (before any episode starts)."""
        self.loop, self.changed = loop, asyncio.Event()

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None,
                       **_: Any) -> RequestOutput:
        if multi_modal_data:
            raise ValueError(f"{self.where}: llm_engine.generate got multi_modal_data; this project's rollouts are text only")
        params = read_turn_params(sampling_params, self.defaults, f"{self.where} (llm_engine.generate's sampling_params)")
        caller = asyncio.get_running_loop()
        request = Request([int(t) for t in prompt_token_ids], params.capped(self.defaults.max_new_tokens), caller,
                          caller.create_future())
        if self.loop is None:
            raise RuntimeError("BatchingEngine.generate before attach: the rollout has not started")
        self.loop.call_soon_threadsafe(self._add, request)
        return await request.future

    def _add(self, request: Request) -> None:
        if self.error is not None:
            request.loop.call_soon_threadsafe(_fail, request.future, self.error)
            return
        self.pending.append(request)
        self._progress()

    def episode_started(self) -> None:
        self.open += 1

    def episode_ended(self) -> None:
        self.open -= 1
        self._progress()

    def _progress(self) -> None:
        self.last_progress = time.monotonic()
        if self.changed is not None:
            self.changed.set()

    async def serve(self) -> None:
        """Answer batches until `stop` (the rollout's episodes are done). If the engines fail, every waiting and
        later request fails with their error."""
        changed = self.changed
        if changed is None:
            raise RuntimeError("BatchingEngine.serve before attach")
        while not self.stopped:
            changed.clear()
            if not self.pending or len(self.pending) < self.open:
                try:
                    await asyncio.wait_for(changed.wait(), timeout=IDLE_S)
                    continue  # something arrived: look again
                except TimeoutError:
                    if not self.pending:
                        continue
            if self.stopped:
                break
            batch, self.pending = sorted(self.pending, key=lambda r: (r.ids, repr(r.params))), []
            self.busy = True
            try:
                samples = await asyncio.to_thread(self.answer, [r.ids for r in batch], [r.params for r in batch],
                                                  self.seed + 7919 * self.rounds)
            except Exception as exc:  # every episode waiting now or later gets it; the rollout then ends with it
                self.error = exc
                for r in [*batch, *self.pending]:
                    r.loop.call_soon_threadsafe(_fail, r.future, exc)
                self.pending = []
                return
            finally:
                self.last_progress = time.monotonic()  # before `busy` drops: a long batch is not idleness
                self.busy = False
            self.rounds += 1
            self._progress()
            for r, s in zip(batch, samples):
                r.loop.call_soon_threadsafe(_settle, r.future, self.output(r, s))

    def output(self, request: Request, sample: Sample) -> RequestOutput:
        ids = sample.response_ids
        stopped = bool(ids) and (ids[-1] == self.tokenizer.eos_token_id or len(ids) < request.params.max_new_tokens)
        text = decoded(self.tokenizer, ids, skip_special_tokens=True)
        logprobs = [{t: Logprob(lp)} for t, lp in zip(ids, sample.log_probs)]
        return RequestOutput(request.ids, [CompletionOutput(0, text, list(ids), logprobs, "stop" if stopped else "length")])


def _settle(future: asyncio.Future, value: RequestOutput) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
