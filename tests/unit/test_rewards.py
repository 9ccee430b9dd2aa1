"""The reward interface's pure helpers, the function scorer's errors, and the remote client against
a local server (including a dead one and a slow one)."""

from __future__ import annotations

import asyncio
import collections
import random
import threading
import time
from pathlib import Path

import pytest
import torch
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

import configs
from configs.errors import RewardError
from configs.schema import RewardConfig
from stages.common.dist_env import free_port
from stages.data.tokenization import last_token_index
from stages.rewards import func_file as reward_file
from stages.rewards.base import RewardBatch, RewardSource
from stages.rewards.factory import build_scorer, resolve_func_path
from stages.rewards.func_scorer import FunctionScorer
from stages.rewards.prm_scorer import (
    aggregate,
    split_steps,
    step_probabilities,
    with_placeholders,
)
from stages.rewards.remote import RemoteScorer, backoff_delays
from stages.rewards.rm_scorer import rm_query

PH = "<|step|>"


def one_line_error(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message
    return message


# --- process-reward helpers -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "steps"),
    [
        ("1+2=3<|step|>\nAnswer: 3<|step|>\n", ["1+2=3", "Answer: 3"]),  # the training layout
        ("1+2=3<|step|>\nAnswer: 3", ["1+2=3", "Answer: 3"]),  # unterminated last step still counts
        ("<|step|><|step|>x", ["", "", "x"]),  # a placeholder is a step even when empty
        ("1+2=3\nAnswer: 3", ["1+2=3", "Answer: 3"]),  # no placeholder: split by the separator
        ("\n a \n\n  \nb\n", ["a", "b"]),  # blank pieces are not steps
        ("", []),
        ("   ", []),
    ],
)
def test_split_steps(response, steps):
    assert split_steps(response, PH, "\n") == steps
    # one placeholder per step in the text the PRM scores
    assert with_placeholders(response, PH, "\n").count(PH) == len(steps)


def test_with_placeholders_reproduces_training_layout():
    assert with_placeholders("1+2=3\nAnswer: 3", PH, "\n") == "1+2=3<|step|>\nAnswer: 3<|step|>"
    assert with_placeholders("a\n\nb\n", PH, "\n") == "a<|step|>\n\nb<|step|>\n"
    assert with_placeholders("a<|step|>\nb", PH, "\n") == "a<|step|>\nb<|step|>"
    assert with_placeholders("a<|step|>\n", PH, "\n") == "a<|step|>\n"  # already terminated: unchanged
    assert with_placeholders("a. b.", PH, ". ") == "a<|step|>. b.<|step|>"


def test_aggregate():
    scores = [0.9, 0.2, 0.7]
    assert aggregate(scores, "min") == 0.2
    assert aggregate(scores, "mean") == pytest.approx(0.6)
    assert aggregate(scores, "last") == 0.7
    assert aggregate([], "min") == aggregate([], "mean") == aggregate([], "last") == 0.0
    with pytest.raises(ValueError, match="unknown aggregate 'max'"):
        aggregate(scores, "max")


def test_step_probabilities_softmax_over_the_two_reward_tokens():
    logits = torch.tensor([[5.0, 1.0, 1.0, -9.0], [0.0, 50.0, 3.0, 3.0]])  # other tokens must not matter
    probs = step_probabilities(logits, good_id=1, bad_id=2)
    assert torch.allclose(probs, torch.tensor([0.5, torch.sigmoid(torch.tensor(47.0)).item()]))


# --- reward-model helpers ------------------------------------------------------------------------


def test_rm_query_reads_every_query_at_one_eos():
    assert rm_query("a+b", "<e>", "<p>") == "a+b<e>"
    assert rm_query("a+b<e>", "<e>", "<p>") == "a+b<e>"
    assert rm_query("<p><p>a+b<e><p><p>", "<e>", "<p>") == "a+b<e>"
    assert rm_query("a<e>b", "<e>", "<p>") == "a<e>b<e>"  # only the ends are touched
    assert rm_query("a+b", None, None) == "a+b"


@pytest.mark.timeout(10)
def test_rm_query_strips_in_one_pass_however_long_the_run_of_marks():
    """A run of marks inside a query: a pattern anchored at the end tried every start in it (a 312 KiB query
    of `<|im_end|>` took 11.6 s, 100,000 of them minutes); stripping by position reads each end once."""
    run = "<|im_end|>" * 100_000
    assert rm_query("a" + run + "b", "<|im_end|>", None) == "a" + run + "b<|im_end|>"
    assert rm_query(run + "a" + run, "<|im_end|>", "<pad>") == "a<|im_end|>"
    assert rm_query(run, "<|im_end|>", None) == "<|im_end|>"


def test_last_token_index_right_and_left_padding():
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 0], [1, 0, 0, 0, 0]])
    assert last_token_index(mask).tolist() == [2, 4, 3, 0]


def test_backoff_delays_double_with_jitter():
    delays = backoff_delays(4, 0.2, random.Random(1))
    for delay, base in zip(delays, [0.2, 0.4, 0.8, 1.6], strict=True):  # base x a factor in [0.5, 1.5)
        assert 0.5 * base <= delay < 1.5 * base
    assert delays != backoff_delays(4, 0.2, random.Random(2))  # clients refused together come back apart
    assert backoff_delays(0, 0.2) == []


# --- the function scorer and its bundled arithmetic rule ----------------------------------------


def test_arithmetic_reward_from_the_configs_package(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # not found from the cwd, so found under configs/
    arithmetic = RewardConfig(func_path="rewards/arithmetic.py")  # the tiny preset's
    path = resolve_func_path(arithmetic.func_path)
    assert path == Path(configs.__file__).parent / "rewards" / "arithmetic.py"
    scorer = build_scorer(arithmetic)
    assert isinstance(scorer, FunctionScorer) and isinstance(scorer, RewardSource)
    prompts = ["Compute 2+3\n", "Compute 5-7\n", "Answer: 4\n", "Compute 1+1\n", "Compute 9+0\n"]
    responses = ["2+3=5\nAnswer: 5<|end|>", "5-7=-2\nAnswer: -2", "no idea", "Answer: 3\nAnswer: 2", "Answer: 9"]
    labels = ["5", " -2 ", "4", "2", None]
    batch = scorer.score(prompts, responses, labels)
    # the prompt's own "Answer: 4" is not the response's; the last answer counts; no label, no reward
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert batch.rewards.dtype == torch.float32
    assert batch.extra_logs == {"answered": pytest.approx(0.8)}


def test_func_path_from_cwd_and_absolute(monkeypatch, tmp_path):
    (tmp_path / "mine.py").write_text("def reward_func(q, p, l):\n    return [0.5] * len(q)\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_func_path("mine.py") == Path("mine.py")
    assert resolve_func_path(str(tmp_path / "mine.py")) == tmp_path / "mine.py"
    batch = build_scorer(RewardConfig(func_path="mine.py")).score(["a", "b"], ["c", "d"], [None, None])
    assert batch.rewards.tolist() == [0.5, 0.5] and batch.extra_logs == {}
    with pytest.raises(RewardError) as err:
        resolve_func_path("rewards/nope.py")
    assert "reward.func_path=rewards/nope.py" in one_line_error(err)


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "rf.py"
    path.write_text(body)
    return path


def score_with(path: Path, n: int = 2) -> RewardBatch:
    return FunctionScorer(path).score(["p"] * n, ["r"] * n, ["1"] * n)


def test_function_scorer_return_forms(tmp_path):
    path = write(tmp_path, "import torch\ndef reward_func(queries, prompts, labels):\n"
                           "    assert queries == ['pr', 'pr'] and prompts == ['p', 'p'] and labels == ['1', '1']\n"
                           "    return {'scores': torch.tensor([1, 2]), 'extra_logs': {'a': torch.tensor([1.0, 0.0]), 'b': 3}}\n")
    batch = score_with(path)
    assert batch.rewards.tolist() == [1.0, 2.0] and batch.rewards.dtype == torch.float32
    assert batch.extra_logs == {"a": 0.5, "b": 3.0}
    path = write(tmp_path, "import torch\ndef reward_func(q, p, l):\n    return torch.tensor([[0.25], [0.75]], dtype=torch.float64)\n")
    assert score_with(path).rewards.tolist() == [0.25, 0.75]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("x = 1\n", "defines no reward_func"),
        ("def reward_func(q, p, l)\n", "import failed (SyntaxError"),
        ("import no_such_module_xyz\n", "import failed (ModuleNotFoundError"),
        ("def reward_func(q, p, l):\n    raise KeyError('label missing')\n", "raised KeyError: 'label missing'"),
        ("def reward_func(q, p, l):\n    return [1.0]\n",
         "returned 1 rewards for 2 queries (got list [1.0]; expected one number per query)"),
        ("def reward_func(q, p, l):\n    return [1.0, float('nan')]\n", "non-finite rewards (NaN/inf) at indices [1]"),
        ("def reward_func(q, p, l):\n    return [float('inf'), 0.0]\n", "non-finite rewards (NaN/inf) at indices [0]"),
        ("def reward_func(q, p, l):\n    return ['good', 'bad']\n", "rewards are not numbers"),
        ("def reward_func(q, p, l):\n    return None\n", "rewards are not numbers"),
        ("def reward_func(q, p, l):\n    return {'reward': [1.0, 0.0]}\n", "without 'rewards' or 'scores'"),
        ("def reward_func(q, p, l):\n    return {'rewards': [1.0, 0.0], 'extra_logs': {'x': 'y'}}\n", "extra_logs['x'] is not numeric"),
    ],
)
def test_function_scorer_errors_are_one_line_naming_the_file(tmp_path, body, expected):
    path = write(tmp_path, body)
    with pytest.raises(RewardError) as err:
        score_with(path)
    message = one_line_error(err)
    assert str(path) in message and expected in message


def test_function_scorer_checks_the_signature_when_loaded(tmp_path):
    path = write(tmp_path, "def reward_func(queries, prompts):\n    return [1.0] * len(queries)\n")
    with pytest.raises(RewardError) as err:
        FunctionScorer(path)
    assert f"reward function file {path}: reward_func cannot be called as reward_func(queries, prompts, labels)" \
        in one_line_error(err)


# --- the reward file, checked without running it (the driver's preflight) -------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("def reward_func(q, p, l)\n    return q\n", "line 1: SyntaxError: expected ':'; fix the file"),
        ("def reward_func(q, p, l):\nreturn q\n", "line 2: IndentationError: expected an indented block"),
        ("def reward(q, p, l):\n    return q\n",
         "defines no reward_func; define reward_func(queries, prompts, labels) returning one reward per query"),
        ("def reward_func(queries, prompts):\n    return queries\n",
         "line 1: reward_func(queries, prompts) takes 2 positional arguments, not 3; it is called as "
         "reward_func(queries, prompts, labels)"),
        ("def reward_func(q, p, l, tokenizer):\n    return q\n", "reward_func(q, p, l, tokenizer) needs 4 positional arguments"),
        ("def reward_func(q, p, l, *, mode):\n    return q\n", "needs keyword-only argument mode"),
        ("x = 1\n\n\ndef reward_func():\n    return []\n", "line 4: reward_func() takes 0 positional arguments, not 3"),
    ],
)
def test_reward_file_errors_name_the_key_and_file(tmp_path, body, expected):
    path = write(tmp_path, body)
    with pytest.raises(RewardError) as err:
        reward_file.check(path)
    message = one_line_error(err)
    assert message.startswith(f"reward.func_path={path}: ") and expected in message


@pytest.mark.parametrize(
    "body",
    [
        "def reward_func(queries, prompts, labels, **kwargs):\n    return queries\n",
        "def reward_func(*args):\n    return args[0]\n",
        "def reward_func(q, p, l, k=1, *, scale=2.0):\n    return q\n",
        "def reward_func(q, /, p, l):\n    return q\n",
        "from os.path import join as reward_func\n",  # bound by an import: checked when loaded
        "reward_func = lambda q, p, l: [0.0] * len(q)\n",
        "try:\n    from fast_rewards import reward_func\nexcept ImportError:\n    def reward_func(q, p, l):\n        return q\n",
        "import functools\n\n@functools.cache\ndef reward_func(q):\n    return q\n",  # decorated: not judged statically
        "from helpers import *\n",
        "import no_such_module_xyz\n\ndef reward_func(q, p, l):\n    return q\n",  # not run, so not imported
    ],
)
def test_reward_file_that_may_be_good_passes_the_static_check(tmp_path, body):
    reward_file.check(write(tmp_path, body))


def test_reward_file_for_the_presets_passes():
    for name in ("rewards/arithmetic.py", "rewards/gsm8k.py"):
        reward_file.check(resolve_func_path(name))


def test_function_scorer_missing_file(tmp_path):
    with pytest.raises(RewardError) as err:
        FunctionScorer(tmp_path / "missing.py")
    assert f"{tmp_path / 'missing.py'}: no such file" in one_line_error(err)


def test_build_scorer_needs_a_model_or_url():
    for cfg, expected in [
        (RewardConfig(source="rm"), "reward.rm_paths is empty"),
        (RewardConfig(source="prm"), "reward.prm_path is empty"),
        (RewardConfig(source="remote"), "needs reward.url"),
    ]:
        with pytest.raises(RewardError) as err:
            build_scorer(cfg)
        assert expected in one_line_error(err)
    remote = build_scorer(RewardConfig(source="remote", url="http://127.0.0.1:1/get_reward", timeout_s=2, retries=5,
                                       batch_size=8))
    assert isinstance(remote, RemoteScorer) and (remote.timeout_s, remote.retries, remote.batch_size) == (2, 5, 8)


# --- the remote client ----------------------------------------------------------------------------


def make_test_app() -> FastAPI:
    app = FastAPI()
    app.state.calls = {"flaky": 0}
    app.state.last = None
    app.state.bodies = []
    app.state.hits = collections.Counter()  # requests per path: a retry shows as a second hit

    @app.middleware("http")
    async def count(request: Request, call_next):
        app.state.hits[request.url.path] += 1
        return await call_next(request)

    @app.post("/get_reward")
    async def get_reward(request: Request) -> dict:
        body = await request.json()
        app.state.last = body
        app.state.bodies.append(body)
        rewards = [float(len(q)) for q in body["query"]]
        return {"rewards": rewards, "scores": rewards, "extra_logs": {"n": [1.0, 3.0]}}

    @app.post("/flaky")
    async def flaky(request: Request):
        app.state.calls["flaky"] += 1
        if app.state.calls["flaky"] <= 2:
            return Response("<html>\n<h1>503</h1>\noverloaded\n</html>", status_code=503)
        return {"rewards": [0.5] * len((await request.json())["query"])}

    @app.post("/down")
    async def down() -> Response:
        return Response("<html>\n<h1>502 Bad Gateway</h1>\n</html>", status_code=502)

    @app.post("/short")
    async def short() -> dict:
        return {"rewards": [1.0]}

    @app.post("/words")
    async def words() -> dict:
        return {"rewards": ["a", "b"]}

    @app.post("/nokey")
    async def nokey() -> dict:
        return {"scores_only": [1.0, 2.0]}

    @app.post("/text")
    async def text() -> Response:
        return Response("<html>oops</html>", media_type="text/html")

    @app.post("/too_large")
    async def too_large() -> Response:
        return Response('{"detail": "request body of 9999 bytes is over this server\'s limit of 1024 bytes"}',
                        status_code=413, media_type="application/json")

    @app.post("/slow")
    async def slow() -> dict:  # a reply far past any client's timeout in these tests
        await asyncio.sleep(60)
        return {"rewards": [0.0, 0.0]}

    @app.post("/trickle")
    async def trickle() -> StreamingResponse:  # a byte every 0.1 s for a minute: each read alone is quick
        async def drip():
            for _ in range(600):
                yield b" "
                await asyncio.sleep(0.1)
        return StreamingResponse(drip(), media_type="application/json")

    @app.post("/huge")
    async def huge() -> Response:  # 20 MiB of JSON
        return Response('{"rewards": [0.0, 0.0], "pad": "' + "x" * (20 * 2**20) + '"}', media_type="application/json")

    @app.post("/many_logs")
    async def many_logs() -> dict:
        return {"rewards": [0.0, 0.0], "extra_logs": {f"k{i}": 1.0 for i in range(10_000)}}

    @app.post("/odd_log_key")
    async def odd_log_key() -> dict:
        return {"rewards": [0.0, 0.0], "extra_logs": {"a b\nc": 1.0}}

    @app.post("/locked")
    async def locked(request: Request):
        if request.headers.get("authorization") != "Bearer s3cret":
            return Response('{"detail": "missing or wrong bearer token"}', status_code=401, media_type="application/json")
        return {"rewards": [1.0, 1.0]}

    return app


@pytest.fixture(scope="module")
def server():
    app = make_test_app()
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.started, "test server did not start"
    yield f"http://127.0.0.1:{port}", app
    srv.should_exit = True
    thread.join(timeout=5)


PROMPTS, RESPONSES, LABELS = ["ab", "c"], ["cd", ""], ["4", None]


def test_remote_scores_and_sends_the_openrlhf_payload(server):
    base, app = server
    batch = RemoteScorer(f"{base}/get_reward", timeout_s=5, retries=0).score(PROMPTS, RESPONSES, LABELS)
    assert batch.rewards.tolist() == [4.0, 1.0] and batch.rewards.dtype == torch.float32
    assert batch.extra_logs == {"n": 2.0}
    assert app.state.last == {"query": ["abcd", "c"], "prompts": PROMPTS, "labels": LABELS}


def test_remote_sends_batch_size_queries_per_request(server):
    base, app = server
    app.state.bodies.clear()
    prompts = ["a", "bb", "ccc", "dddd", "e"]
    batch = RemoteScorer(f"{base}/get_reward", timeout_s=5, retries=0, batch_size=2).score(prompts, ["x"] * 5, [None] * 5)
    assert [b["query"] for b in app.state.bodies] == [["ax", "bbx"], ["cccx", "ddddx"], ["ex"]]
    assert [b["prompts"] for b in app.state.bodies] == [["a", "bb"], ["ccc", "dddd"], ["e"]]
    assert batch.rewards.tolist() == [2.0, 3.0, 4.0, 5.0, 2.0]
    assert batch.extra_logs == {"n": 2.0}


def test_remote_retries_5xx_then_succeeds(server):
    base, app = server
    app.state.calls["flaky"] = 0
    waits: list[float] = []
    scorer = RemoteScorer(f"{base}/flaky", timeout_s=5, retries=3, backoff_s=0.01, sleep=waits.append)
    batch = scorer.score(PROMPTS, RESPONSES, LABELS)
    assert batch.rewards.tolist() == [0.5, 0.5] and app.state.calls["flaky"] == 3
    assert len(waits) == 2  # a wait before each of the two retries, none after the success


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/short", "returned 1 rewards for 2 queries"),
        ("/words", "rewards are not numbers"),
        ("/nokey", "reply has no 'rewards'"),
        ("/text", "reply is not JSON"),
        ("/missing", "HTTP 404"),  # a client error is not retried
        ("/too_large", "HTTP 413: request body of 9999 bytes is over this server's limit of 1024 bytes; "
                       "lower reward.batch_size (now 32 queries a request)"),
    ],
)
def test_remote_bad_replies(server, path, expected):
    base, app = server
    with pytest.raises(RewardError) as err:
        RemoteScorer(f"{base}{path}", timeout_s=5, retries=3, backoff_s=1.0).score(PROMPTS, RESPONSES, LABELS)
    message = one_line_error(err)
    assert f"{base}{path}" in message and expected in message
    assert app.state.hits[path] == 1  # a user error is not retried


def test_remote_5xx_every_time_fails_after_retries_on_one_line(server):
    base, _ = server
    with pytest.raises(RewardError) as err:
        RemoteScorer(f"{base}/down", timeout_s=5, retries=2, backoff_s=0.01).score(PROMPTS, RESPONSES, LABELS)
    message = one_line_error(err)
    assert f"{base}/down: failed after 3 tries (last error: HTTP 502: <html> <h1>502 Bad Gateway</h1> </html>)" in message


def test_remote_bad_url_fails_at_once():
    with pytest.raises(RewardError) as err:
        RemoteScorer("127.0.0.1:5001/get_reward", retries=3, backoff_s=5.0).score(PROMPTS, RESPONSES, LABELS)
    assert "reward server 127.0.0.1:5001/get_reward: " in one_line_error(err)


@pytest.mark.timeout(60)  # a refused connection fails at once: a hang fails here
def test_remote_down_server_fails_after_retries_backing_off_between_them():
    url = f"http://127.0.0.1:{free_port()}/get_reward"  # nothing listens: connection refused
    waits: list[float] = []
    with pytest.raises(RewardError) as err:
        RemoteScorer(url, timeout_s=1.0, retries=2, backoff_s=0.1, sleep=waits.append).score(PROMPTS, RESPONSES, LABELS)
    message = one_line_error(err)
    assert url in message and "after 3 tries" in message and "ConnectionError" in message
    # one wait before each retry, doubling from backoff_s = 0.1 s, each times a jitter factor in [0.5, 1.5)
    assert len(waits) == 2 and 0.05 <= waits[0] < 0.15 and 0.1 <= waits[1] < 0.3


def test_remote_slow_server_is_not_sent_the_request_again(server):
    """A try that reached the server and ran out of time is not re-sent: a slow server is not sent more work."""
    base, app = server
    waits: list[float] = []
    start = time.monotonic()
    with pytest.raises(RewardError) as err:
        RemoteScorer(f"{base}/slow", timeout_s=0.3, retries=3, backoff_s=0.05, sleep=waits.append).score(PROMPTS, RESPONSES, LABELS)
    elapsed = time.monotonic() - start
    message = one_line_error(err)
    assert message.startswith(f"reward server {base}/slow: no whole reply within reward.timeout_s=0.3 (")
    assert message.endswith("); not sent again: raise reward.timeout_s or make the server faster")
    assert app.state.hits["/slow"] == 1 and waits == []  # one try, no wait for another
    assert elapsed < 30, f"{elapsed:.1f} s: reward.timeout_s=0.3 did not end the wait for the 60 s reply"


# hostile replies: each ends within its deadline with one line naming the server, and is not re-sent
@pytest.mark.parametrize(("path", "expected"), [
    ("/trickle", "no whole reply within reward.timeout_s=1 ("),
    ("/huge", f"reply over {16 * 2**20} bytes; a reply holds rewards for reward.batch_size (now 32) queries"),
    ("/many_logs", "extra_logs has 10000 keys, over 32; log fewer"),
    ("/odd_log_key", "extra_logs key str 'a b\\nc' is not a metric name (up to 64 letters, digits and _ - . /); rename it"),
    ("/locked", "HTTP 401: missing or wrong bearer token; set RLHF_REWARD_TOKEN to the server's token"),
])
def test_remote_hostile_replies_end_in_one_line_within_the_deadline(server, monkeypatch, path, expected):
    base, app = server
    monkeypatch.delenv("RLHF_REWARD_TOKEN", raising=False)
    start = time.monotonic()
    with pytest.raises(RewardError) as err:
        RemoteScorer(f"{base}{path}", timeout_s=1, retries=3, backoff_s=0.05).score(PROMPTS, RESPONSES, LABELS)
    message = one_line_error(err)
    assert message.startswith(f"reward server {base}{path}: ") and expected in message, message
    assert app.state.hits[path] == 1
    took = time.monotonic() - start
    assert took < 30, f"{took:.1f} s: reward.timeout_s=1 did not end the read (the trickle alone would last a minute)"


def test_remote_sends_the_bearer_token_of_its_environment(server, monkeypatch):
    base, _ = server
    monkeypatch.setenv("RLHF_REWARD_TOKEN", "s3cret")
    batch = RemoteScorer(f"{base}/locked", timeout_s=5, retries=0).score(PROMPTS, RESPONSES, LABELS)
    assert batch.rewards.tolist() == [1.0, 1.0]


def test_no_reward_function_outside_the_tiny_preset_is_one_line_naming_reward_source():
    assert RewardConfig().func_path is None
    with pytest.raises(RewardError, match=r"^reward.source=func and no reward.func_path: set reward.func_path to a file "
                                          r"defining reward_func\(queries, prompts, labels\), or reward.source to rm, prm or remote$"):
        resolve_func_path(None)
