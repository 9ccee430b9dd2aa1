"""The two-turn chained arithmetic of agents/chained_arithmetic.py, played through an OpenAI client
(`rl.agent.path=agents/chained_arithmetic_openai.py`): an executor whose `run_agent` talks to the policy at
/v1/chat/completions, as OpenRLHF's agent_func_openai_server_executor.py is used
(stages/rl/openai_server.py). Turn 1 asks `Compute a+b`; turn 2 asks the whole `Compute a+b-c` and starts the
answer with the policy's own first result (`continue_final_message`), as the task's two-turn SFT rows do.
Reward 1 when the second answer is the prompt's result; needs `pip install rlhf-pipeline[agents]`."""

import re

from stages.rl.openai_server import MODEL, OpenAIServerExecutor

EXPRESSION = re.compile(r"Compute (\d+)([+-])(\d+)(?:([+-])(\d+))?")
ANSWER = re.compile(r"Answer:\s*(-?\d+)")


def apply(left, op, right):
    return left + right if op == "+" else left - right


class AgentExecutor(OpenAIServerExecutor):
    async def run_agent(self, prompt, label, session_id):
        found = EXPRESSION.search(prompt)
        if found is None:
            raise ValueError(f"no `Compute a+b[-c]` in the prompt {prompt!r}")
        a, op1, b, op2, c = found.groups()
        op2, c = (op2, int(c)) if op2 else ("+", 0)
        expected = apply(apply(int(a), op1, int(b)), op2, c)
        messages = [{"role": "user", "content": f"Compute {a}{op1}{b}"}]
        reply = await self.ask(messages, session_id)
        found = ANSWER.search(reply)
        if found is None:
            return {"reward": 0.0}
        first = int(found.group(1))
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": f"Compute {a}{op1}{b}{op2}{c}"}]
        reply = await self.ask(messages, session_id, prefix=f"{a}{op1}{b}={first}\n")
        found = ANSWER.search(reply)
        return {"reward": float(found is not None and int(found.group(1)) == expected)}

    async def ask(self, messages, session_id, prefix=None):
        """The policy's answer; with `prefix`, the answer starts with it (as the task's worked solutions do)."""
        extra = {"session_id": session_id}
        if prefix is not None:
            messages = [*messages, {"role": "assistant", "content": prefix}]
            extra |= {"continue_final_message": True, "add_generation_prompt": False}
        response = await self.client.chat.completions.create(
            model=MODEL, messages=messages, temperature=self.sampling_params.temperature,
            max_tokens=self.sampling_params.max_tokens, logprobs=True, extra_body=extra)
        return response.choices[0].message.content
