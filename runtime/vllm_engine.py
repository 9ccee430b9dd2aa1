"""vLLM rollout engine: `vllm.LLM` inside a Ray actor, returning the same `Sample`s as the HF engine.

vLLM pins its own versions of fastapi, transformers and friends, so it usually lives in a Python
environment of its own (`rl.rollout.vllm_python`, made by `rlhf vllm-env`). The actor is started with that
interpreter through Ray's `runtime_env`; this module therefore imports nothing of the pipeline but
`stages.rl.experience` (torch only), and vLLM itself only inside the actor.
"""

from __future__ import annotations

import os
from pathlib import Path

import ray

from stages.rl.experience import Sample

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the folder of runtime/ and stages/, which the engine imports


def runtime_env(python: str | None, threads: int) -> dict:
    """The actor's interpreter (None: the driver's own) and environment. vLLM's V1 engine would
    otherwise start a second process per engine; in-process keeps the weight sync a plain call."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)}
    return {"env_vars": env, **({"py_executable": python} if python else {})}


@ray.remote
class VLLMRolloutEngine:
    """One vLLM engine holding the rollout copy of the policy."""

    def __init__(self, given, options: dict, threads: int):
        """`given`: stages.dag.contract.NodeInputs, the policy read on this actor's node."""
        import torch
        from vllm import LLM

        if torch.get_num_threads() != threads:  # as dist_env.use_threads: set_num_threads costs MKL its dynamic mode
            torch.set_num_threads(threads)
        self.model_path = model_path = given.path("sft_model")
        self.llm = LLM(model=model_path, tokenizer=model_path, enforce_eager=True,
                       worker_extension_cls="stages.rl.vllm_weights.WeightReceiver",  # weight sync by broadcast
                       # log-probs of log_softmax(logits / T): what the trainer computes for the sampled ids
                       logprobs_mode="processed_logprobs", **options)
        self.generate([[0]], seed=0, temperature=1.0, max_new_tokens=2)  # the first call compiles; pay it now

    def ready(self) -> bool:
        return True

    def torch_version(self) -> str:
        import torch

        return torch.__version__

    def device_type(self) -> str:
        """Where vLLM computes: its CUDA build on a GPU that torch sees, else the CPU build."""
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def weight_specs(self) -> list:
        """What the engine takes from the policy: the checkpoint's tensors (HF names, shapes, dtypes)."""
        from stages.rl.weight_sync import checkpoint_specs

        return checkpoint_specs(self.model_path)

    def join_weight_group(self, master: tuple[str, int], rank: int, world_size: int, backend: str) -> None:
        self.llm.collective_rpc("join_weight_group", args=(master, rank, world_size, backend))

    def receive_weights(self, wanted: list) -> None:
        """The policy's new weights, broadcast parameter by parameter into the workers, then drop cached
        prefixes: their KV entries were computed with the old weights."""
        self.llm.collective_rpc("receive_weights", args=(wanted,))
        self.llm.reset_prefix_cache()

    def load_weights(self, state_dict: dict) -> None:
        """The policy's new weights (HF names; a tied lm_head may be absent), then drop cached prefixes:
        their KV entries were computed with the old weights."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state_dict.items()),
                                                          "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()

    def generate(self, prompt_ids: list[list[int]], seed: int, temperature: float | None, max_new_tokens: int,
                 top_p: float = 1.0, stop: tuple[str, ...] = ()) -> list[Sample]:
        """Samples at `temperature` (None: greedy), each ending at EOS or after the first of the `stop`
        strings (which need the text: detokenized only then). Prompt i gets seed `seed + i`, so a prompt's
        sample does not depend on what else is in the batch."""
        from vllm import SamplingParams, TokensPrompt

        params = [SamplingParams(temperature=temperature or 0.0, top_p=top_p if temperature else 1.0,
                                 max_tokens=max_new_tokens, logprobs=0, seed=seed + i, stop=list(stop) or None,
                                 detokenize=bool(stop))
                  for i in range(len(prompt_ids))]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params, use_tqdm=False)
        samples = []
        for p, out in zip(prompt_ids, outputs):
            done = out.outputs[0]
            ids = list(done.token_ids)
            samples.append(Sample(list(p), ids, [lp[t].logprob for t, lp in zip(ids, done.logprobs)]))
        return samples
