"""What the multi-turn agent tests share: the tiny task's prompt, an engine that answers from a script, and the
RL driver's actors with one in-process reward worker holding the environments (the task's tokenizer is the
`tokenizer` fixture of tests/unit/conftest.py)."""

from __future__ import annotations

from stages.dag.contract import NodeInputs
from stages.rl.experience import Sample
from stages.rl.in_process import InProcess
from stages.rl.reward_worker import RewardWorker

PROMPT = "<|user|>\nCompute 7+14-9\n<|assistant|>\n"


class ScriptedEngine:
    """Answers each turn with the next text of its script, as token ids with made-up log-probs."""

    def __init__(self, tokenizer, script: list[str]):
        self.tokenizer, self.script, self.contexts, self.settings = tokenizer, script, [], []

    def generate(self, prompt_ids, seed, temperature, max_new_tokens, top_p, stop=()):
        self.contexts.append(prompt_ids)
        self.settings.append((temperature, max_new_tokens, top_p, stop))
        text = self.script[len(self.contexts) - 1]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return [Sample(list(p), ids, [-0.5] * len(ids)) for p in prompt_ids]


class Actors:
    def __init__(self, cfg, engine):
        self.backend, self.samplers = InProcess(), [engine]
        worker = RewardWorker(1)
        worker.setup(cfg, NodeInputs({}), [], ".")
        self.reward = [worker]
