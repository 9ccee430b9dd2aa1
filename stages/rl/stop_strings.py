"""Where a response ends when it is to stop at a string (an agent turn's `stop`): after the token that
completes the first stop string, as vLLM ends it. A pure function of the tokenizer's decoding."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def stop_end(tokenizer: PreTrainedTokenizerBase, ids: list[int], stop: tuple[str, ...]) -> int:
    """How many of `ids` the response keeps: up to the shortest prefix whose text holds a stop string, else
    all. A prefix's text only grows, so a binary search finds it in log2(len(ids)) decodes."""

    def stopped(n: int) -> bool:
        text = tokenizer.decode(ids[:n], skip_special_tokens=True)
        return any(s in text for s in stop)

    if not stop or not stopped(len(ids)):
        return len(ids)
    low, high = 1, len(ids)  # stopped(high) holds
    while low < high:
        mid = (low + high) // 2
        if stopped(mid):
            high = mid
        else:
            low = mid + 1
    return high
