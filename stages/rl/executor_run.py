"""A rollout of an agent executor that owns its episodes (`AgentExecutor.execute`, OpenRLHF's
AgentExecutorBase API; stages/openrlhf_compat/agent.py): every episode's `execute` runs concurrently in an
event loop of the driver's, against a `BatchingEngine` over the rollout engines, and each result (OpenRLHF's
dict: `observation_tokens`, `action_ranges`, `rollout_log_probs`, `reward`, `scores`, `extra_logs`) becomes
one `Sample`: the tokens before the first action its prompt, the actions trained, the rest masked, the
episode's reward on its last action's last token.

The executor is made once per rollout and its `aclose()` (if it has one) awaited at the end, so a server it
starts lives for the rollout only. A rollout in which no request, answer or finished episode happens for
`rl.agent.timeout_s` is cancelled (its `aclose()` still awaited) and ends the stage with one line; code that
blocks the event loop itself cannot be stopped, and its thread is left behind.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from configs.errors import RewardError, first_line
from stages.openrlhf_compat.agent import as_float
from stages.rewards.base import mean_logs
from stages.rl.batching_engine import BatchingEngine
from stages.rl.experience import Sample
from stages.rl.turn_params import TurnParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from configs.schema import PipelineConfig
    from stages.rl.batching_engine import Answer


def episode_sample(result: Any, max_length: int, prompt_max_len: int, where: str) -> tuple[Sample, float, float | None,
                                                                                          dict[str, float]]:
    """One `execute` result as a Sample with its reward, score and logs, or one line saying what is wrong with it."""
    if not isinstance(result, dict):
        raise RewardError(f"{where} returned {type(result).__name__}; it must return a dict with observation_tokens, "
                          "action_ranges, rollout_log_probs and reward")
    missing = [k for k in ("observation_tokens", "action_ranges", "rollout_log_probs", "reward") if result.get(k) is None]
    if missing:
        raise RewardError(f"{where} returned no {', '.join(missing)} (keys: {sorted(result)}); the episode needs its "
                          "tokens, the policy's ranges among them, their log-probs (sampling_params.logprobs set) and "
                          "its reward")
    tokens, ranges, log_probs = list(result["observation_tokens"]), list(result["action_ranges"]), list(result["rollout_log_probs"])
    if len(log_probs) != len(tokens):
        raise RewardError(f"{where} returned {len(log_probs)} rollout_log_probs for {len(tokens)} observation_tokens; "
                          "they must be as many")
    if len(tokens) > max_length:
        raise RewardError(f"{where} returned an episode of {len(tokens)} tokens; max_length is {max_length}")
    previous = 0
    for start, end in ranges:
        if not previous <= start < end <= len(tokens) or (previous == 0 and start == 0):
            raise RewardError(f"{where} returned action_ranges {ranges} for {len(tokens)} tokens; each must be "
                              "(start, end) with 0 < start < end <= len(observation_tokens), in order, not overlapping")
        previous = end
    if not ranges:
        raise RewardError(f"{where} returned no action_ranges: the policy said nothing in the episode")
    first = ranges[0][0]
    if first > prompt_max_len:
        raise RewardError(f"{where}: the episode's first observation is {first} tokens; it must be at most "
                          f"rl.rollout.prompt_max_len={prompt_max_len}")
    trained = [0] * (len(tokens) - first)
    for start, end in ranges:
        trained[start - first : end - first] = [1] * (end - start)
    reward = as_float(result["reward"], "reward", where)
    score = None if result.get("scores") is None else as_float(result["scores"], "scores", where)
    logs = mean_logs(result["extra_logs"], where) if result.get("extra_logs") else {}
    sample = Sample(tokens[:first], tokens[first:], [lp if t else 0.0 for lp, t in zip(log_probs[first:], trained)],
                    trained, [end - 1 - first for _, end in ranges])
    return sample, reward, score, logs


def run_executor(executor_cls: type, path: Path, answer: Answer, tokenizer: PreTrainedTokenizerBase, texts: list[str],
                 labels: list[str | None], cfg: PipelineConfig, seed: int,
                 defaults: TurnParams) -> tuple[list[Sample], list[float], list[tuple[float | None, dict[str, float]]]]:
    """One episode per prompt text, each `execute(prompt, label, sampling_params, max_length, tokenizer, engine)`:
    the episodes, their rewards, and their scores and logs. `max_length` (an episode's token budget) is
    rl.rollout.prompt_max_len + defaults.max_new_tokens x rl.agent.max_turns."""
    rl = cfg.rl
    where = f"AgentExecutor.execute in {path}"
    max_length = rl.rollout.prompt_max_len + defaults.max_new_tokens * rl.agent.max_turns
    engine = BatchingEngine(answer, tokenizer, defaults, seed, where)
    results: list[Any] = []
    failed: list[BaseException] = []

    async def rollout() -> None:
        try:
            executor = executor_cls()
        except Exception as exc:
            raise RewardError(f"AgentExecutor() in {path} raised {type(exc).__name__}: {first_line(exc)}") from exc
        engine.attach(asyncio.get_running_loop())
        serving = asyncio.create_task(engine.serve())

        async def episode(i: int) -> Any:
            engine.episode_started()
            try:
                return await executor.execute(texts[i], labels[i], defaults.as_sampling_params(), max_length,
                                              tokenizer, engine)  # a SamplingParams of its own: it may change it
            finally:
                engine.episode_ended()

        try:
            done = await asyncio.gather(*(episode(i) for i in range(len(texts))), return_exceptions=True)
        finally:
            engine.stop()
            await asyncio.gather(serving, return_exceptions=True)
            closing = getattr(executor, "aclose", None)
            if closing is not None:
                await closing()
        if engine.error is not None:  # the engines' failure, not the episodes' reading of it
            raise engine.error
        for i, value in enumerate(done):
            if isinstance(value, RewardError):
                raise value
            if isinstance(value, BaseException):
                raise RewardError(f"{where} raised {type(value).__name__} in episode {i}: {first_line(value)}") from value
        results.extend(done)

    loop = asyncio.new_event_loop()
    main = loop.create_task(rollout())

    def run() -> None:
        try:
            loop.run_until_complete(main)
        except BaseException as exc:  # re-raised in the driver's thread
            failed.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, daemon=True, name="agent-executor")
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
        if not engine.busy and time.monotonic() - engine.last_progress > rl.agent.timeout_s:
            # cancelled, the rollout's `finally` stops what the executor started (its server); code that blocks
            # the loop itself cannot be stopped, and its thread is left behind
            loop.call_soon_threadsafe(main.cancel)
            thread.join(5)
            raise RewardError(f"rl.agent.path={rl.agent.path}: {where} made no request and ended no episode for "
                              f"rl.agent.timeout_s={rl.agent.timeout_s:g} s; fix the executor or raise rl.agent.timeout_s")
    if failed:
        raise failed[0]
    played = [episode_sample(r, max_length, rl.rollout.prompt_max_len, f"{where} (episode {i})") for i, r in enumerate(results)]
    return [p[0] for p in played], [p[1] for p in played], [(p[2], p[3]) for p in played]
