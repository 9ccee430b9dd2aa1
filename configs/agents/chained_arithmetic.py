"""A two-turn environment for the tiny task (`rl.agent.path=agents/chained_arithmetic.py`): the last
operation of `Compute a+b-c` is held back until the policy has answered the first part, and the second
turn builds on the policy's own first answer.

    turn 1, the policy sees:   Compute a+b                       and answers ... Answer: X
    turn 2, the policy sees:   Compute a+b-c, then a+b=X         and continues X-c=... Answer: Y

Reward 1 at the second turn when Y is the prompt's result (so a wrong X fails the episode), else 0; an
answer with no `Answer: N` line ends the episode at 0. A two-term prompt `Compute a+b` gets `+0` as its
held-back part, so every episode takes two turns. The second observation writes a new user turn and
starts the assistant's answer with the first step, `a+b=X` (the form of the task's worked solutions),
with the chat markers of the prompt the episode started from: the text around its expression.

Train the SFT policy with `data.synthetic.two_turn_share=0.25` first (a quarter of its rows in these two
turns): a policy that never saw a second turn answers it at about 0.1, however the first went.
"""

import re

EXPRESSION = re.compile(r"Compute (\d+)([+-])(\d+)(?:([+-])(\d+))?")
ANSWER = re.compile(r"Answer:\s*(-?\d+)")


def apply(left: int, op: str, right: int) -> int:
    return left + right if op == "+" else left - right


class Environment:
    def reset(self, prompt: str, label: str | None) -> str:
        found = EXPRESSION.search(prompt)
        if found is None:
            raise ValueError(f"no `Compute a+b[-c]` in the prompt {prompt!r}")
        a, op1, b, op2, c = found.groups()
        self.before, self.after = prompt[: found.start()], prompt[found.end():]
        self.first = f"{a}{op1}{b}"
        self.held_back = (op2, int(c)) if op2 else ("+", 0)
        self.expected = apply(apply(int(a), op1, int(b)), *self.held_back)
        self.turn = 0
        return f"{self.before}Compute {self.first}{self.after}"

    def step(self, observation: str, action: str) -> tuple[float, str, bool]:
        self.turn += 1
        answer = ANSWER.search(action)
        if answer is None:
            return 0.0, "", True
        value = int(answer.group(1))
        if self.turn == 1:
            op, c = self.held_back
            return 0.0, f"\n{self.before}Compute {self.first}{op}{c}{self.after}{self.first}={value}\n", False
        return float(value == self.expected), "", True
