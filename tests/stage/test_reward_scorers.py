"""The model-backed reward sources on tiny checkpoints built here: the RM scorer against
`AutoModelForSequenceClassification`, several RMs, normalization, the PRM's per-step scores, and
`rlhf serve-rm` as a real server process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
)

from configs.errors import CheckpointError, RewardError
from configs.schema import RewardConfig, TinyModelConfig
from stages.common import checkpoint
from stages.common.dist_env import free_port
from stages.data_prep.tiny_model import STEP, build_model, train_tokenizer
from stages.rewards.factory import build_scorer
from stages.rewards.prm_scorer import ProcessRewardScorer, aggregate
from stages.rewards.remote import RemoteScorer
from stages.rewards.rm_scorer import RewardModelScorer

REPO = Path(__file__).resolve().parents[2]
CORPUS = [f"Compute {a}+{b}-{c}\n{a}+{b}={a + b}\n{a + b}-{c}={a + b - c}\nAnswer: {a + b - c}"
          for a in range(12) for b in range(12) for c in range(3)]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(CORPUS, 96)


def save_rm(tok, out: Path, seed: int, prefix: str = "score", normalize: bool = False,
            mean: float = 0.0, std: float = 1.0) -> Path:
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(config)
    model.config.update({"value_head_prefix": prefix, "normalize_reward": normalize, "reward_mean": mean, "reward_std": std})
    state = {(k.replace("score.", f"{prefix}.", 1) if k.startswith("score.") else k): v for k, v in model.state_dict().items()}
    model.save_pretrained(out, state_dict=state)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def rms(tok, tmp_path_factory):
    root = tmp_path_factory.mktemp("rms")
    return {
        "a": save_rm(tok, root / "a", seed=0),
        "b": save_rm(tok, root / "b", seed=1),
        "a_norm": save_rm(tok, root / "a_norm", seed=0, normalize=True, mean=0.25, std=2.0),
        "a_value_head": save_rm(tok, root / "a_vh", seed=0, prefix="value_head"),
    }


@pytest.fixture(scope="module")
def prm(tok, tmp_path_factory):
    model = build_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2), tok, seed=0)
    model.config.update({"prm_placeholder_token": STEP, "prm_reward_tokens": ["+", "-"], "prm_step_separator": "\n"})
    return checkpoint.save(model, tok, tmp_path_factory.mktemp("prm") / "prm")


def texts(tok) -> list[str]:
    """~20 queries of different lengths, ending with EOS as the preference data does."""
    return [CORPUS[i][: 8 + 2 * (i // 10)] + tok.eos_token for i in range(0, 400, 20)]


def test_rm_scorer_matches_sequence_classification(tok, rms):
    hf = AutoModelForSequenceClassification.from_pretrained(rms["a"], num_labels=1).eval()
    queries = texts(tok)
    with torch.no_grad():  # one row at a time: no padding involved in the reference
        expected = torch.stack([hf(**tok(q, return_tensors="pt", add_special_tokens=False)).logits[0, 0] for q in queries])
    scorer = RewardModelScorer([rms["a"]], batch_size=6)  # right-padded batches of mixed lengths
    got = scorer.score_queries(queries)
    assert got.shape == (len(queries),) and got.dtype == torch.float32
    assert (got - expected).abs().max() < 1e-4
    # a query without EOS (as decoded without special tokens) is read at the EOS appended for it
    assert (scorer.score_queries([q.removesuffix(tok.eos_token) for q in queries]) - got).abs().max() < 1e-6
    # score() tokenizes prompt and response apart; split where the tokenizer splits anyway, it is score_queries
    batch = scorer.score([q[:8] for q in queries], [q[8:] for q in queries], [None] * len(queries))
    assert (batch.rewards - got).abs().max() < 1e-6 and batch.step_rewards is None
    # the head is found under any value_head_prefix
    other = RewardModelScorer([rms["a_value_head"]], batch_size=6).score_queries(queries)
    assert (other - got).abs().max() < 1e-6


def test_several_rms_are_summed_as_openrlhf_does_or_averaged(tok, rms):
    queries = texts(tok)
    a = RewardModelScorer([rms["a"]]).score_queries(queries)
    b = RewardModelScorer([rms["b"]]).score_queries(queries)
    assert not torch.allclose(a, b)
    for combine, expected in (("sum", a + b), ("mean", (a + b) / 2)):
        both = build_scorer(RewardConfig(source="rm", rm_paths=[str(rms["a"]), str(rms["b"])], rm_combine=combine))
        assert (both.score_queries(queries) - expected).abs().max() < 1e-6


def test_normalized_rm(tok, rms):
    queries = texts(tok)
    raw = RewardModelScorer([rms["a"]], batch_size=8).score_queries(queries)
    normalized = RewardModelScorer([rms["a_norm"]], batch_size=8).score_queries(queries)
    assert torch.equal(normalized, (raw - 0.25) / 2.0)


def constant_rm(tok, out: Path, bias: float, **fields) -> Path:
    """An RM whose head has zero weights and bias `bias`: its raw reward is `bias` for every text, exactly. `fields`
    go to config.json beside the architecture's (e.g. OpenRLHF's `mean` and `std`)."""
    save_rm(tok, out, seed=0)
    config = json.loads((out / "config.json").read_text())
    for key in ("normalize_reward", "reward_mean", "reward_std"):
        config.pop(key)
    (out / "config.json").write_text(json.dumps({**config, **fields}))
    state = load_file(out / "model.safetensors")
    state["score.weight"] = torch.zeros_like(state["score.weight"])
    state["score.bias"] = torch.tensor([bias])
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out


def rewards(path: Path, normalize: bool | None) -> list[float]:
    scorer = build_scorer(RewardConfig(source="rm", rm_paths=[str(path)], normalize=normalize))
    return scorer.score(["Compute 1+2", ""], ["3", "Compute 4+4\n8"], [None, None]).rewards.tolist()


def test_reward_normalize_reads_openrlhfs_mean_and_std(tok, tmp_path):
    """OpenRLHF's RM trainer stores its eval statistics as `mean` and `std`, and saves normalize_reward false:
    reward.normalize=true (its --normalize_reward) normalizes with them. Raw reward 3, mean 1, std 0.5:
    (3 - 1) / 0.5 = 4."""
    path = constant_rm(tok, tmp_path / "openrlhf_rm", 3.0, normalize_reward=False, mean=1.0, std=0.5)
    assert rewards(path, True) == [4.0, 4.0]
    assert rewards(path, None) == [3.0, 3.0]  # as the checkpoint says: raw
    assert rewards(path, False) == [3.0, 3.0]


def test_reward_normalize_reads_our_reward_mean_and_std_and_can_be_turned_off(tok, tmp_path):
    """The rm stage's checkpoint: reward_mean and reward_std (taken before OpenRLHF's keys when it has both), and
    normalize_reward true. Raw reward 3, mean -1, std 4: (3 + 1) / 4 = 1."""
    path = constant_rm(tok, tmp_path / "our_rm", 3.0, normalize_reward=True, reward_mean=-1.0, reward_std=4.0,
                       mean=100.0, std=100.0)
    assert rewards(path, None) == [1.0, 1.0]  # as the checkpoint says: normalized
    assert rewards(path, True) == [1.0, 1.0]
    assert rewards(path, False) == [3.0, 3.0]  # the off switch: raw


def test_normalizing_without_stored_statistics_is_one_line_naming_the_key_and_checkpoint(tok, tmp_path):
    bare = constant_rm(tok, tmp_path / "bare", 3.0, normalize_reward=False)
    with pytest.raises(RewardError, match=rf"^{bare}: reward.normalize=true asks for normalized rewards, and its config.json "
                                          r"stores no reward statistics \(reward_mean and reward_std, or OpenRLHF's mean and "
                                          r"std\); set reward.normalize=false for its raw rewards$"):
        rewards(bare, True)
    assert rewards(bare, None) == [3.0, 3.0]
    says_so = constant_rm(tok, tmp_path / "says_so", 3.0, normalize_reward=True)
    with pytest.raises(RewardError, match=rf"^{says_so}: its config.json's normalize_reward asks for normalized rewards"):
        rewards(says_so, None)
    assert rewards(says_so, False) == [3.0, 3.0]
    zero_std = constant_rm(tok, tmp_path / "zero_std", 3.0, mean=1.0, std=0.0)
    with pytest.raises(RewardError, match=r"its stored reward std is 0.0 \(must be > 0\)"):
        rewards(zero_std, True)


def test_rm_uses_own_checkpoint_when_none_configured(rms):
    scorer = build_scorer(RewardConfig(source="rm"), {"reward_model": rms["a"]})
    assert isinstance(scorer, RewardModelScorer) and scorer.paths == [str(rms["a"])]


def test_not_a_reward_model(prm, tmp_path):
    with pytest.raises(RewardError, match=r"not a reward model \(no score.weight"):
        RewardModelScorer([prm])
    with pytest.raises(CheckpointError, match=r"no config.json"):
        RewardModelScorer([tmp_path])


def manual_step_scores(prm: Path, tok, prompt: str, text: str) -> list[float]:
    """P('+') vs '-' at each placeholder, straight from the causal LM."""
    model = AutoModelForCausalLM.from_pretrained(prm).eval()
    ids = tok(prompt, add_special_tokens=False)["input_ids"] + tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    good, bad = tok.convert_tokens_to_ids(["+", "-"])
    at = [i for i, t in enumerate(ids) if t == tok.convert_tokens_to_ids(STEP)]
    return logits[at][:, [good, bad]].softmax(-1)[:, 0].tolist()


def test_prm_step_scores_and_aggregates(tok, prm):
    prompts = ["<|user|>\nCompute 3+4-1\n<|assistant|>\n", "<|user|>\nCompute 11+2\n<|assistant|>\n",
               "<|user|>\nCompute 5+5\n<|assistant|>\n", "<|user|>\nCompute 1+1\n<|assistant|>\n"]
    responses = [
        f"3+4=7{STEP}\n7-1=6{STEP}\nAnswer: 6{STEP}\n",  # the training layout
        "11+2=13\nAnswer: 13",  # no placeholders: split by the separator
        f"5+5=10{STEP}\nAnswer: 10",  # unterminated last step
        "",  # no steps at all
    ]
    scorer = ProcessRewardScorer(prm, aggregate="min", batch_size=3)
    batch = scorer.score(prompts, responses, ["6", "13", "10", "2"])
    steps = batch.step_rewards
    assert [len(s) for s in steps] == [3, 2, 2, 0]
    expected = [
        manual_step_scores(prm, tok, prompts[0], responses[0]),
        manual_step_scores(prm, tok, prompts[1], f"11+2=13{STEP}\nAnswer: 13{STEP}"),
        manual_step_scores(prm, tok, prompts[2], f"5+5=10{STEP}\nAnswer: 10{STEP}"),
    ]
    for got, want in zip(steps, expected):
        assert got == pytest.approx(want, abs=1e-5)
    assert all(0.0 < p < 1.0 for s in steps for p in s)
    assert batch.rewards.tolist() == pytest.approx([min(s) for s in steps[:3]] + [0.0])
    assert batch.extra_logs == {"prm/steps": pytest.approx(7 / 4)}
    for how in ("mean", "last"):
        rewards = ProcessRewardScorer(prm, aggregate=how).score(prompts, responses, [None] * 4).rewards
        assert rewards.tolist() == pytest.approx([aggregate(s, how) for s in steps])
    own = build_scorer(RewardConfig(source="prm", prm_aggregate="last"), {"prm": prm})
    assert isinstance(own, ProcessRewardScorer) and own.how == "last"


def test_offloaded_scorers_score_as_the_resident_ones(tok, rms, prm):
    """rl.placement.reward_offload: each model's weights in host memory, lent to the device for each scoring call
    (one RM at a time); the same rewards."""
    queries = texts(tok)
    resident = RewardModelScorer([rms["a"], rms["b"]], batch_size=8)
    offloaded = build_scorer(RewardConfig(source="rm", rm_paths=[str(rms["a"]), str(rms["b"])], batch_size=8), offload=True)
    assert isinstance(offloaded, RewardModelScorer)
    assert torch.equal(offloaded.score_queries(queries), resident.score_queries(queries))
    assert [m.offload for m in offloaded.models] == [True, True] and [m.lent for m in offloaded.models] == [1, 1]
    assert [m.lent for m in resident.models] == [0, 0]
    prompts, responses = ["<|user|>\nCompute 3+4-1\n<|assistant|>\n"], [f"3+4=7{STEP}\n7-1=6{STEP}\n"]
    steps = ProcessRewardScorer(prm).score(prompts, responses, [None]).step_rewards
    held = build_scorer(RewardConfig(source="prm"), {"prm": prm}, offload=True)
    assert isinstance(held, ProcessRewardScorer)
    assert held.score(prompts, responses, [None]).step_rewards == steps and held.held.lent == 1


def test_not_a_prm(rms):
    with pytest.raises(RewardError, match="not a process reward model"):
        ProcessRewardScorer(rms["a"])


def test_not_a_prm_config(tok, tmp_path):
    plain = build_model(TinyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2), tok, seed=0)
    path = checkpoint.save(plain, tok, tmp_path / "lm")
    with pytest.raises(RewardError, match=r"not a process reward model .*lacks prm_placeholder_token"):
        ProcessRewardScorer(path)


@pytest.fixture(scope="module")
def serve_rm(rms):
    """`rlhf serve-rm` on the "a" RM, as a real server process: its base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli.main", "serve-rm", "--model", str(rms["a"]), "--port", str(port), "--batch-size", "4",
         "--max-queries", "6000"],  # the concurrency test's large request
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"serve-rm exited early:\n{proc.stdout.read()}"
            assert time.monotonic() < deadline, "serve-rm did not become healthy within 60 s"
            try:
                if requests.get(f"{base}/health", timeout=1).ok:
                    break
            except (requests.ConnectionError, requests.Timeout):  # not up yet, or slow to answer on a busy machine
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_serve_rm_cli_matches_in_process_scorer(tok, rms, serve_rm):
    base = serve_rm
    queries = texts(tok)
    reply = requests.post(f"{base}/get_reward", json={"query": queries}, timeout=30).json()
    local = RewardModelScorer([rms["a"]], batch_size=4).score_queries(queries)
    assert (torch.tensor(reply["rewards"]) - local).abs().max() < 1e-4
    assert reply["scores"] == reply["rewards"]
    # the pipeline's remote client against it, with prompts and labels in the payload, 6 queries a request
    remote = RemoteScorer(f"{base}/get_reward", timeout_s=10, retries=0, batch_size=6)
    batch = remote.score([q[:8] for q in queries], [q[8:] for q in queries], ["1"] * len(queries))
    assert (batch.rewards - local).abs().max() < 1e-4


@pytest.mark.slow
def test_serve_rm_answers_a_request_over_its_size_limit_413_at_once_and_goes_on_serving(serve_rm):
    """A 5 MB body (about 170,000 queries) would hold the model for minutes and every request behind it."""
    base = serve_rm
    huge = json.dumps({"query": ["Compute 1+2\n1+2=3\nAnswer: 3"] * 170_000}).encode()
    assert len(huge) > 5_000_000
    started = time.monotonic()
    reply = requests.post(f"{base}/get_reward", data=huge, headers={"Content-Type": "application/json"}, timeout=60)
    took = time.monotonic() - started
    assert reply.status_code == 413
    # scoring it would take minutes: the answer comes from the declared length, generous bound for a loaded machine
    assert took < 20, f"{took:.1f} s to the 413: the server read or scored the body first"
    assert reply.json() == {"detail": f"request body of {len(huge)} bytes is over this server's limit of 1048576 bytes "
                                      "(rlhf serve-rm --max-request-mb); send fewer queries per request"}
    # without a declared length (chunked), cut off as it streams past the limit
    chunks = (huge[i : i + 65536] for i in range(0, len(huge), 65536))
    reply = requests.post(f"{base}/get_reward", data=chunks, headers={"Content-Type": "application/json"}, timeout=30)
    assert reply.status_code == 413 and "is over this server's limit of 1048576 bytes" in reply.json()["detail"]
    # the pipeline's remote client: one line naming the key that sets its request size
    with pytest.raises(RewardError) as err:
        RemoteScorer(f"{base}/get_reward", timeout_s=10, retries=0, batch_size=60_000).score(
            ["Compute 1+2\n"] * 60_000, ["1+2=3"] * 60_000, [None] * 60_000)
    assert str(err.value).startswith(f"reward server {base}/get_reward: HTTP 413: request body of ")
    assert str(err.value).endswith("; lower reward.batch_size (now 60000 queries a request)")
    started = time.monotonic()
    small = requests.post(f"{base}/get_reward", json={"query": ["Compute 1+2\n1+2=3\nAnswer: 3"]}, timeout=60)
    took = time.monotonic() - started
    assert small.ok and len(small.json()["rewards"]) == 1
    assert took < 20, f"{took:.1f} s for one query: the refused requests left work holding the model"


@pytest.mark.slow
def test_serve_rm_scores_concurrent_requests_in_turns(serve_rm):
    """A small request sent while a large one is being scored is answered first: requests take turns on
    the model batch by batch, so none waits out another."""
    base = serve_rm
    done: list[str] = []  # the order the replies came back in

    def post(name: str, n: int) -> None:
        # the large one's wait is long: on a loaded machine its 1,500 forward passes have taken over two minutes
        requests.post(f"{base}/get_reward", json={"query": ["Compute 1+2\n1+2=3\nAnswer: 3"] * n}, timeout=600).raise_for_status()
        done.append(name)

    large = threading.Thread(target=post, args=("large", 6000))  # 1,500 forward passes at --batch-size 4: seconds, even on an idle machine
    large.start()
    time.sleep(0.5)  # it has reached the server
    assert "large" not in done
    post("small", 1)
    large.join(timeout=600)
    assert done == ["small", "large"]


# --- serve-rm against hostile requests: each answered within its deadline, the server serving others meanwhile ---


class HeldScorer(RewardModelScorer):
    """The real scorer, holding each batch until `release` is set: a request that stays in line as long as a test needs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.release, self.entered = threading.Event(), threading.Event()

    def score_queries(self, queries: list[str]) -> torch.Tensor:
        self.entered.set()
        assert self.release.wait(30)
        return super().score_queries(queries)


@pytest.fixture(scope="module")
def guarded(rms):
    """serve-rm's app with a token and small limits, served by uvicorn in this process: its base URL and scorer."""
    import uvicorn

    from stages.rewards.server import make_app
    from stages.rewards.serving import Limits

    scorer = HeldScorer([rms["a"]], batch_size=4)
    scorer.release.set()
    app = make_app(scorer, Limits(max_queries=8, max_query_chars=4000, max_waiting=1), token="s3cret")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield f"http://127.0.0.1:{port}", scorer
    scorer.release.set()
    server.should_exit = True
    thread.join(timeout=5)


AUTH = {"Authorization": "Bearer s3cret"}
QUERY = "Compute 1+2\n1+2=3\nAnswer: 3"
UNAUTHORIZED = "missing or wrong bearer token; the client sets RLHF_REWARD_TOKEN"


@pytest.mark.parametrize(("headers", "body", "status", "detail"), [
    ({}, {"query": [QUERY]}, 401, UNAUTHORIZED),
    ({"Authorization": "Bearer wrong"}, {"query": [QUERY]}, 401, UNAUTHORIZED),
    ({"Authorization": "s3cret"}, {"query": [QUERY]}, 401, UNAUTHORIZED),
    (AUTH, {"query": [QUERY] * 9}, 413, "9 queries in one request, over this server's limit of 8 "
                                        "(rlhf serve-rm --max-queries); send fewer per request"),
    (AUTH, {"query": ["1" * 4001]}, 413, "a query of 4001 characters, over this server's limit of 4000 "
                                         "(rlhf serve-rm --max-query-chars)"),
    (AUTH, {"query": "not a list"}, 422, None),
])
def test_serve_rm_refuses_a_hostile_request_at_once(guarded, headers, body, status, detail):
    base, _ = guarded
    reply = requests.post(f"{base}/get_reward", json=body, headers=headers, timeout=5)
    assert reply.status_code == status
    if detail is not None:
        assert reply.json() == {"detail": detail}
    assert requests.post(f"{base}/get_reward", json={"query": [QUERY]}, headers=AUTH, timeout=5).ok  # still serving


def test_serve_rm_health_names_no_path(guarded, rms):
    base, _ = guarded
    assert requests.get(f"{base}/health", timeout=5).status_code == 401
    reply = requests.get(f"{base}/health", headers=AUTH, timeout=5)
    assert reply.json() == {"status": "ok", "models": 1} and str(rms["a"]) not in reply.text


def test_serve_rm_scores_a_query_over_the_model_length_at_its_end(guarded, tok):
    """The tiny RM reads 2,048 positions (LlamaConfig's default); digits are one token each here. A query of
    3,000 digits before the real one scores as the 2,048 tokens that end it."""
    base, _scorer = guarded
    tail = QUERY + tok.eos_token
    tail_len = len(tok(tail, add_special_tokens=False)["input_ids"])
    assert len(tok("1" * 10, add_special_tokens=False)["input_ids"]) == 10
    long = requests.post(f"{base}/get_reward", json={"query": ["1" * 3000 + tail]}, headers=AUTH, timeout=30).json()
    cut = requests.post(f"{base}/get_reward", json={"query": ["1" * (2048 - tail_len) + tail]}, headers=AUTH,
                        timeout=30).json()
    assert long["rewards"] == cut["rewards"]


def test_serve_rm_turns_away_requests_beyond_its_line(guarded):
    """--max-waiting 1: with one request held at the model, the next is answered 503 at once and may retry."""
    base, scorer = guarded
    scorer.release.clear()
    scorer.entered.clear()
    held: dict[str, requests.Response] = {}
    first = threading.Thread(target=lambda: held.setdefault(
        "reply", requests.post(f"{base}/get_reward", json={"query": [QUERY]}, headers=AUTH, timeout=30)))
    first.start()
    try:
        assert scorer.entered.wait(10)  # the first request is at the model
        busy = requests.post(f"{base}/get_reward", json={"query": [QUERY]}, headers=AUTH, timeout=5)
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
        assert busy.json() == {"detail": "1 requests are waiting for the model (rlhf serve-rm --max-waiting); retry later"}
    finally:
        scorer.release.set()
        first.join(timeout=30)
    assert held["reply"].ok


def test_serve_rm_beyond_loopback_needs_a_token(rms, monkeypatch):
    from configs.errors import ConfigError
    from stages.rewards.server import serve

    monkeypatch.delenv("RLHF_REWARD_TOKEN", raising=False)
    with pytest.raises(ConfigError, match=r"^rlhf serve-rm --host 0\.0\.0\.0: a server reachable from other machines "
                                          r"needs a token; set RLHF_REWARD_TOKEN in its environment and in the clients', "
                                          r"or serve on 127\.0\.0\.1$"):
        serve(rms["a"], host="0.0.0.0", port=free_port())
