"""An agent executor behind an OpenAI-compatible server (as OpenRLHF's
examples/python/agent_func_openai_server_executor.py): an agent file subclasses `OpenAIServerExecutor` and
overrides `run_agent(prompt, label, session_id)`, which drives the episode through `self.client` (an
`openai.AsyncOpenAI` pointed at the server) or any HTTP client at `self.base_url`, passing
`extra_body={"session_id": session_id}` so that the calls of one episode are one session. Each session's
token ids and log-probs are recorded as the engine gave them, and the episode becomes one training sample:
the first call's prompt, then every answer (trained) and the tokens between them (masked).

The server binds 127.0.0.1 on a free port, asks for a bearer token made for the rollout (`self.api_key`), and
lives for the rollout only (the RL stage awaits `aclose`). Endpoints: `/v1/chat/completions`, `/v1/models`,
`/tokenize`, `/health`; a chat completion takes vLLM's `continue_final_message` (the policy goes on with
the last, assistant, message). A later call of a session must extend the session's tokens: its prompt's text starts
with the session's last prompt and the answer as it was returned, and only the rest is tokenized, so earlier
tokens are reused as they were sampled; a call that rewrites an earlier turn is refused with one line naming
the session.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading
import time
import uuid
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from configs.errors import RewardError, first_line
from stages.openrlhf_compat.agent import AgentExecutorBase

MODEL = "policy"  # the name /v1/models lists: the policy being trained, whatever its path
START_S = 30.0  # seconds the server may take to start
STOP_S = 10.0


class OpenAIServerExecutor(AgentExecutorBase):
    """Override `run_agent`; its return value may carry `reward` (else 0), `scores` and `extra_logs`."""

    async def run_agent(self, prompt: str, label: str | None, session_id: str) -> dict:
        """One chat completion of the prompt as a user message (override for multi-turn work)."""
        await self.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=self.sampling_params.max_tokens,
            temperature=self.sampling_params.temperature, top_p=self.sampling_params.top_p, logprobs=True,
            extra_body={"session_id": session_id})
        return {}

    async def execute(self, prompt: str, label: str | None, sampling_params: Any, max_length: int, hf_tokenizer: Any,
                      llm_engine: Any) -> dict:
        if not hasattr(self, "starting"):  # the first episode starts it; the others wait for it
            self.starting = asyncio.ensure_future(self._start(sampling_params, max_length, hf_tokenizer, llm_engine))
        await self.starting
        session = f"episode-{uuid.uuid4().hex[:12]}"
        try:
            result = await self.run_agent(prompt, label, session) or {}
            return self._stitched(session, prompt, label, result)
        finally:
            self.traces.pop(session, None)

    async def aclose(self) -> None:
        """Stop the client and the server (the rollout is over)."""
        if getattr(self, "client", None) is not None:
            await self.client.close()
        if hasattr(self, "server"):
            self.server.should_exit = True
            await asyncio.to_thread(self.thread.join, STOP_S)
            if self.thread.is_alive():
                raise RuntimeError(f"the agent's OpenAI-compatible server at {self.base_url} did not stop within "
                                   f"{STOP_S:g} s")

    # the server

    async def _start(self, sampling_params: Any, max_length: int, tokenizer: Any, engine: Any) -> None:
        """The server, in a thread of its own, and the client; on a failed start, nothing left running."""
        self.sampling_params, self.max_length, self.tokenizer, self.engine = sampling_params, max_length, tokenizer, engine
        self.traces: dict[str, list[dict]] = {}
        self.api_key = secrets.token_urlsafe(24)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        server = uvicorn.Server(uvicorn.Config(self._app(), log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="agent-openai-server")
        thread.start()
        deadline = time.monotonic() + START_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                await asyncio.to_thread(thread.join, STOP_S)
                sock.close()
                raise RuntimeError(f"the agent's OpenAI-compatible server at {self.base_url} did not start within "
                                   f"{START_S:g} s")
            await asyncio.sleep(0.01)  # the rollout's loop goes on meanwhile
        self.server, self.thread = server, thread
        try:
            from openai import AsyncOpenAI
        except ImportError:  # run_agent may use another HTTP client at self.base_url
            self.client: Any = None
        else:
            self.client = AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0)

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def authenticated(request: Request, call_next: Any) -> Any:
            if request.url.path != "/health" and \
                    not secrets.compare_digest(request.headers.get("authorization", ""), f"Bearer {self.api_key}"):
                return JSONResponse({"detail": "missing or wrong bearer token"}, status_code=401)
            return await call_next(request)

        @app.get("/health")
        async def health() -> dict:
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models() -> dict:
            return {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "rlhf-pipeline"}]}

        @app.post("/tokenize")
        async def tokenize(request: Request) -> dict:
            body = await request.json()
            ids = self.tokenizer.encode(self._chat_text(body.get("messages"), False), add_special_tokens=False)
            return {"tokens": ids, "count": len(ids), "max_model_len": self.max_length}

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> dict:
            return await self._complete(await request.json())

        return app

    def _chat_text(self, messages: Any, generation_prompt: bool, continue_final: bool = False) -> str:
        """The conversation as the policy's chat template writes it; `continue_final` (vLLM's
        `continue_final_message`): the last (assistant) message left open, for the policy to go on with."""
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise HTTPException(400, "messages must be a non-empty list of {role, content} objects")
        if continue_final:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    async def _complete(self, body: dict) -> dict:
        session = str(body.get("session_id") or f"single-{uuid.uuid4().hex[:12]}")
        text = self._chat_text(body.get("messages"), True, bool(body.get("continue_final_message")))
        traces = self.traces.setdefault(session, [])
        ids = self._session_ids(session, traces[-1], text) if traces else \
            self.tokenizer.encode(text, add_special_tokens=False)
        room = self.max_length - len(ids)
        if room <= 0:
            raise HTTPException(400, f"session {session}: the prompt is {len(ids)} tokens; the episode's budget is "
                                     f"{self.max_length}")
        wanted = {k: body[k] for k in ("temperature", "top_p", "stop") if body.get(k) is not None}
        wanted["max_tokens"] = min(int(body.get("max_tokens") or room), room)
        try:
            out = (await self.engine.generate(ids, wanted)).outputs[0]
        except (RewardError, ValueError) as exc:  # a setting the engine refuses: the client's error
            raise HTTPException(400, f"session {session}: {first_line(exc)}") from None
        completion = list(out.token_ids)
        log_probs = [step[t].logprob for t, step in zip(completion, out.logprobs)]
        traces.append({"prompt_token_ids": ids, "completion_token_ids": completion, "log_probs": log_probs,
                       "finish_reason": out.finish_reason, "text": text, "content": out.text})
        content = None
        if body.get("logprobs"):
            content = [{"token": self.tokenizer.decode([t]), "token_id": t, "logprob": lp, "bytes": None,
                        "top_logprobs": []} for t, lp in zip(completion, log_probs)]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
            "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text},
                         "finish_reason": out.finish_reason,
                         "logprobs": {"content": content} if content is not None else None}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(completion),
                      "total_tokens": len(ids) + len(completion)},
        }

    def _session_ids(self, session: str, last: dict, text: str) -> list[int]:
        """A later call's prompt: the session's tokens so far as they were sampled, then the new text tokenized.
        The new conversation must start with the last call's prompt and the answer as it was returned (its
        text: special tokens the answer held are not in it, and stay in the tokens); the end token the answer
        stopped at is not repeated where the chat template writes it after the answer."""
        answered = last["text"] + last["content"]
        if not text.startswith(answered):
            at = next((i for i, (a, b) in enumerate(zip(text, answered)) if a != b), min(len(text), len(answered)))
            raise HTTPException(400, f"session {session}: the messages rewrite the session's earlier turns (their text "
                                     f"differs at character {at}); send the conversation as it was answered")
        rest = text[len(answered):]
        end = self.tokenizer.eos_token_id
        if last["completion_token_ids"][-1:] == [end] and rest.startswith(marker := self.tokenizer.decode([end])):
            rest = rest[len(marker):]
        return last["prompt_token_ids"] + last["completion_token_ids"] + self.tokenizer.encode(rest, add_special_tokens=False)

    def _stitched(self, session: str, prompt: str, label: str | None, result: dict) -> dict:
        """The session's calls as one episode (each call's prompt extends the one before: checked when made)."""
        traces = self.traces.get(session)
        if not traces:
            raise RuntimeError(f"session {session}: run_agent made no chat completion with "
                               "extra_body={'session_id': session_id}")
        last = traces[-1]
        tokens = last["prompt_token_ids"] + last["completion_token_ids"]
        log_probs = [0.0] * len(tokens)
        ranges = []
        for t in traces:
            start = len(t["prompt_token_ids"])
            ranges.append((start, start + len(t["completion_token_ids"])))
            log_probs[start : start + len(t["log_probs"])] = t["log_probs"]
        return {"prompt": prompt, "label": label, "observation_tokens": tokens, "action_ranges": ranges,
                "rollout_log_probs": log_probs, "truncated": last["finish_reason"] == "length",
                "reward": result.get("reward", 0.0), "scores": result.get("scores"),
                "extra_logs": result.get("extra_logs", {})}
