"""OpenRLHF's agent surface beyond the plain multi-turn instance: an `async def __init__` (its README's
form), per-step `sampling_params`, an executor's own `execute`, and the OpenAI-compatible server executor,
each through the RL driver's `run_episodes` against a scripted engine (token by token: what the episode
becomes, which settings each engine call got, how many calls a rollout made)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx
import pytest

from configs import load_config
from configs.errors import RewardError
from stages.rl.episodes import own_executor_of, run_episodes
from stages.rl.stop_strings import stop_end
from tests.unit.agent_helpers import PROMPT, Actors, ScriptedEngine

pytestmark = pytest.mark.timeout(60)

DATA = Path(__file__).parent.parent / "data"


def config(path: Path | str, *overrides: str):
    return load_config(None, [f"rl.agent.path={path}", *overrides])


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def write(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "agent.py"
    path.write_text(textwrap.dedent(source))
    return path


def test_the_readme_agent_with_an_async_init_plays_its_episodes(tokenizer):
    cfg = config(DATA / "openrlhf_examples" / "readme_agent_func.py", "rl.agent.max_turns=5")
    engine = ScriptedEngine(tokenizer, ["1", "2", "3", "4", "5"])
    samples, scored = run_episodes(Actors(cfg, engine), tokenizer, [PROMPT] * 3, ["1"] * 3, cfg, 0, 1.0, 5)
    # `async def __init__` awaited: each instance drew its 1-3 steps, so each episode took 2 to 4 turns
    assert all(2 <= len(s.turn_ends) <= 4 for s in samples)
    assert all(steps[-1] in (0.0, 1.0) for steps in scored.step_rewards)


STEERING = """
    from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor


    class AgentInstance(AgentInstanceBase):
        def __init__(self):
            self.turn = 0

        async def step(self, states):
            self.turn += 1
            params = states["sampling_params"]
            SEEN.append((params.temperature, params.max_tokens, params.stop))
            params.temperature, params.max_tokens, params.stop = 0.25, 3, ["="]
            return {"rewards": 0.0, "environment_feedback": "\\n", "done": self.turn == 2, "sampling_params": params}


    class AgentExecutor(MultiTurnAgentExecutor):
        def __init__(self):
            super().__init__(AgentInstance)


    SEEN = []
"""


def test_a_steps_sampling_params_set_the_next_turns_temperature_max_tokens_and_stop(tokenizer, tmp_path):
    cfg = config(write(tmp_path, STEERING))
    engine = ScriptedEngine(tokenizer, ["1", "2"])
    run_episodes(Actors(cfg, engine), tokenizer, [PROMPT], ["1"], cfg, 0, 0.7, 5, top_p=0.9)
    # (temperature, max_new_tokens, top_p, stop) of each engine call: the rollout's, then the step's
    assert engine.settings == [(0.7, 5, 0.9, ()), (0.25, 3, 0.9, ("=",))]


def test_a_step_cannot_ask_for_more_tokens_than_the_rollout_gives_a_turn(tokenizer, tmp_path):
    cfg = config(write(tmp_path, STEERING.replace("params.max_tokens, params.stop = 0.25, 3,",
                                                  "params.max_tokens, params.stop = 0.25, 3000,")))
    engine = ScriptedEngine(tokenizer, ["1", "2"])
    run_episodes(Actors(cfg, engine), tokenizer, [PROMPT], ["1"], cfg, 0, 0.7, 5)
    assert engine.settings[1][1] == 5


@pytest.mark.parametrize(("setting", "message"), [
    ("params.temperature = -1", r"sampling_params.temperature=-1; it must be a number >= 0 \(0: greedy\)$"),
    ("params.max_tokens = 0", r"sampling_params.max_tokens=0; it must be an int >= 1$"),
    ("params.stop = [1]", r"sampling_params.stop=\[1\]; it must be a string or a list of non-empty strings$"),
])
def test_bad_sampling_params_from_a_step_are_one_line_naming_the_file(tokenizer, tmp_path, setting, message):
    path = write(tmp_path, STEERING.replace("params.temperature, params.max_tokens, params.stop = 0.25, 3, [\"=\"]",
                                            setting))
    cfg = config(path)
    with pytest.raises(RewardError, match=rf"^AgentInstance.step in {path} returned {message}"):
        run_episodes(Actors(cfg, ScriptedEngine(tokenizer, ["1", "2"])), tokenizer, [PROMPT], ["1"], cfg, 0, 1.0, 5)


OWN_EXECUTE = """
    from openrlhf.utils.agent import AgentExecutorBase

    CALLS = []


    class AgentExecutor(AgentExecutorBase):
        async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine):
            CALLS.append((prompt, label, sampling_params.temperature, max_length, type(hf_tokenizer).__name__))
            ids = hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
            first = (await llm_engine.generate(ids, sampling_params)).outputs[0]
            feedback = hf_tokenizer("\\nagain\\n", add_special_tokens=False)["input_ids"]
            context = ids + list(first.token_ids) + feedback
            sampling_params.max_tokens = 2
            second = (await llm_engine.generate(context, sampling_params)).outputs[0]
            lps = [lp[t].logprob for out in (first, second) for t, lp in zip(out.token_ids, out.logprobs)]
            n1 = len(first.token_ids)
            return {"observation_tokens": context + list(second.token_ids),
                    "action_ranges": [(len(ids), len(ids) + n1), (len(context), len(context) + len(second.token_ids))],
                    "rollout_log_probs": [0.0] * len(ids) + lps[:n1] + [0.0] * len(feedback) + lps[n1:],
                    "reward": float(label) * (first.text == "Answer: 1"), "scores": 0.5, "extra_logs": {"turns": 2}}
"""


def test_an_executors_own_execute_plays_each_episode_and_the_engine_batches_their_requests(tokenizer, tmp_path):
    cfg = config(write(tmp_path, OWN_EXECUTE), "rl.agent.max_turns=3", "rl.rollout.prompt_max_len=64")
    engine = ScriptedEngine(tokenizer, ["Answer: 1", "2"])
    samples, scored = run_episodes(Actors(cfg, engine), tokenizer, [PROMPT] * 3, ["1", "2", "0"], cfg, 0, 0.5, 4)
    # three episodes, two requests each: two engine calls of three prompts
    assert [len(c) for c in engine.contexts] == [3, 3]
    assert engine.settings == [(0.5, 4, 1.0, ()), (0.5, 2, 1.0, ())]
    first = [*encode(tokenizer, "Answer: 1"), tokenizer.eos_token_id]
    feedback = encode(tokenizer, "\nagain\n")
    second = [*encode(tokenizer, "2"), tokenizer.eos_token_id]
    for s in samples:
        assert s.prompt_ids == encode(tokenizer, PROMPT)
        assert s.response_ids == first + feedback + second
        assert s.trained == [1] * len(first) + [0] * len(feedback) + [1] * len(second)
        assert s.log_probs == [-0.5] * len(first) + [0.0] * len(feedback) + [-0.5] * len(second)
        assert s.turn_ends == [len(first) - 1, len(s.response_ids) - 1]
    assert scored.rewards.tolist() == [1.0, 2.0, 0.0]
    assert scored.step_rewards == [[0.0, 1.0], [0.0, 2.0], [0.0, 0.0]]
    assert scored.scores.tolist() == [0.5] * 3 and scored.extra_logs == {"turns": 2.0}
    # execute got the prompt, label, the rollout's sampling settings, the episode budget (64 + 4 x 3) and the tokenizer
    calls = own_executor_of(str(tmp_path / "agent.py")).execute.__globals__["CALLS"]  # the file's module's
    assert calls[0] == (PROMPT, "1", 0.5, 76, type(tokenizer).__name__)


@pytest.mark.parametrize(("change", "message"), [
    ('"reward": float(label) * (first.text == "Answer: 1"),', r"returned no reward"),
    ('"action_ranges": [', r"returned action_ranges \[\(0, "),
])
def test_a_malformed_execute_result_is_one_line_naming_the_file_and_episode(tokenizer, tmp_path, change, message):
    source = OWN_EXECUTE.replace(change, {"\"reward\"": "", "\"action_ranges\"": '"action_ranges": [(0, 1), '}[change.split(":")[0]])
    path = write(tmp_path, source)
    cfg = config(path, "rl.rollout.prompt_max_len=64")
    with pytest.raises(RewardError, match=rf"^AgentExecutor.execute in {path} \(episode 0\)(:)? {message}"):
        run_episodes(Actors(cfg, ScriptedEngine(tokenizer, ["Answer: 1", "2"])), tokenizer, [PROMPT], ["1"], cfg, 0, 1.0, 4)


def test_an_execute_that_never_asks_or_returns_ends_at_the_timeout(tokenizer, tmp_path):
    path = write(tmp_path, """
        import asyncio
        from openrlhf.utils.agent import AgentExecutorBase

        class AgentExecutor(AgentExecutorBase):
            async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine):
                await asyncio.sleep(3600)
    """)
    cfg = config(path, "rl.agent.timeout_s=0.5")
    with pytest.raises(RewardError, match=r"made no request and ended no episode for rl.agent.timeout_s=0.5 s"):
        run_episodes(Actors(cfg, ScriptedEngine(tokenizer, [])), tokenizer, [PROMPT], ["1"], cfg, 0, 1.0, 4)


def test_a_subclass_can_build_on_the_multi_turn_executors_own_execute(tokenizer, tmp_path):
    path = write(tmp_path, STEERING.replace("""    class AgentExecutor(MultiTurnAgentExecutor):
        def __init__(self):
            super().__init__(AgentInstance)""", """    class AgentExecutor(MultiTurnAgentExecutor):
        def __init__(self):
            super().__init__(AgentInstance)

        async def execute(self, *args):
            result = await super().execute(*args)
            return result | {"reward": result["reward"] + 10.0}"""))
    cfg = config(path, "rl.rollout.prompt_max_len=64")
    engine = ScriptedEngine(tokenizer, ["1", "2"])
    (sample,), scored = run_episodes(Actors(cfg, engine), tokenizer, [PROMPT], ["1"], cfg, 0, 0.7, 5)
    assert engine.settings == [(0.7, 5, 1.0, ()), (0.25, 3, 1.0, ("=",))]  # its step's settings honoured there too
    assert scored.rewards.tolist() == [10.0] and len(sample.turn_ends) == 2


@pytest.mark.parametrize("first_answer", ["7+14=21\nAnswer: 21", "7+14=21<|step|>\nAnswer: 21"])
def test_the_openai_client_agent_trains_on_its_sessions_tokens(tokenizer, first_answer):
    """The second call's prompt: the first call's tokens as sampled (a special token in the answer, which the
    returned text leaves out, included), then only the new text tokenized."""
    agent = "agents/chained_arithmetic_openai.py"
    cfg = config(agent, "rl.rollout.prompt_max_len=64")
    engine = ScriptedEngine(tokenizer, [first_answer, "21-9=12\nAnswer: 12"])
    (sample,), scored = run_episodes(Actors(cfg, engine), tokenizer, [PROMPT], ["12"], cfg, 0, None, 20)
    first = [*encode(tokenizer, first_answer), tokenizer.eos_token_id]
    between = encode(tokenizer, "\n<|user|>\nCompute 7+14-9\n<|assistant|>\n7+14=21\n")
    second = [*encode(tokenizer, "21-9=12\nAnswer: 12"), tokenizer.eos_token_id]
    assert sample.prompt_ids == encode(tokenizer, "<|user|>\nCompute 7+14\n<|assistant|>\n")
    assert sample.response_ids == first + between + second
    assert sample.trained == [1] * len(first) + [0] * len(between) + [1] * len(second)
    assert engine.contexts[1] == [sample.prompt_ids + first + between]
    assert engine.settings[0][0] is None  # greedy through the client's temperature 0
    assert scored.rewards.tolist() == [1.0]


SERVER_PROBE = """
    import httpx
    from stages.rl.openai_server import OpenAIServerExecutor

    SEEN = {}


    class AgentExecutor(OpenAIServerExecutor):
        async def run_agent(self, prompt, label, session_id):
            async with httpx.AsyncClient(base_url=self.base_url.removesuffix("/v1"), timeout=10) as http:
                SEEN["health"] = (await http.get("/health")).json()
                SEEN["anonymous"] = (await http.get("/v1/models")).status_code
                SEEN["wrong"] = (await http.get("/v1/models", headers={"authorization": "Bearer x"})).status_code
                auth = {"authorization": f"Bearer {self.api_key}"}
                SEEN["models"] = (await http.get("/v1/models", headers=auth)).json()
                ok = {"messages": [{"role": "user", "content": "Compute 1+2"}], "session_id": session_id}
                SEEN["first"] = (await http.post("/v1/chat/completions", json=ok, headers=auth)).status_code
                rewritten = {"messages": [{"role": "user", "content": "Compute 9+9"}, {"role": "assistant", "content": "x"},
                                          {"role": "user", "content": "y"}], "session_id": session_id}
                bad = await http.post("/v1/chat/completions", json=rewritten, headers=auth)
                SEEN["rewritten"] = (bad.status_code, bad.json()["detail"])
            SEEN["url"] = self.base_url
            return {"reward": 1.0}
"""


def test_the_server_asks_for_its_token_names_the_session_of_a_bad_call_and_ends_with_the_rollout(tokenizer, tmp_path):
    path = write(tmp_path, SERVER_PROBE)
    cfg = config(path, "rl.rollout.prompt_max_len=64")
    (sample,), _ = run_episodes(Actors(cfg, ScriptedEngine(tokenizer, ["Answer: 3"])), tokenizer, [PROMPT], ["3"],
                                cfg, 0, 1.0, 8)
    seen = own_executor_of(str(path)).run_agent.__globals__["SEEN"]  # the file's module's
    assert seen["health"] == {"status": "ok"}  # and nothing else: no model path
    assert (seen["anonymous"], seen["wrong"]) == (401, 401)
    assert seen["models"]["data"][0]["id"] == "policy"
    assert seen["first"] == 200
    status, detail = seen["rewritten"]
    assert status == 400 and detail.startswith("session episode-") and "rewrite the session's earlier turns" in detail
    assert "\n" not in detail
    assert seen["url"].startswith("http://127.0.0.1:")
    with pytest.raises(httpx.ConnectError):  # the server lived for the rollout only
        httpx.get(seen["url"].removesuffix("/v1") + "/health", timeout=2)
    assert sample.trained.count(1) == len(encode(tokenizer, "Answer: 3")) + 1


def test_a_response_ends_after_the_token_that_completes_a_stop_string(tokenizer):
    ids = encode(tokenizer, "7+14=21\nAnswer: 21")
    # by hand: the shortest prefix whose text holds "=" ends with the "=" token's piece
    pieces = [tokenizer.decode(ids[:n]) for n in range(1, len(ids) + 1)]
    expected = next(n for n, text in enumerate(pieces, 1) if "=" in text)
    assert stop_end(tokenizer, ids, ("=",)) == expected
    assert tokenizer.decode(ids[:expected]).endswith("=") or "=" in tokenizer.decode(ids[expected - 1 : expected])
    assert stop_end(tokenizer, ids, ("Answer", "+")) == next(n for n, t in enumerate(pieces, 1) if "+" in t)
    assert stop_end(tokenizer, ids, ("%",)) == len(ids)


def test_hf_sampling_ends_after_the_stop_string_and_is_otherwise_the_same_answer(tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from stages.rl.workers import sample

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=len(tokenizer),
                                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id))
    rl = load_config(None, []).rl
    ids = [encode(tokenizer, PROMPT)]
    full = sample(model, tokenizer, rl, ids, 0, None, 12)[0].response_ids
    pieces = [tokenizer.decode(full[:n], skip_special_tokens=True) for n in range(1, len(full) + 1)]
    stop = next(p[-1] for p in pieces[3:] if p.strip())  # a character the greedy answer reaches after a few tokens
    expected = next(n for n, text in enumerate(pieces, 1) if stop in text)  # by hand: the first prefix holding it
    stopped = sample(model, tokenizer, rl, ids, 0, None, 12, stop=(stop,))[0]
    assert stopped.response_ids == full[:expected]
    assert len(stopped.log_probs) == expected
