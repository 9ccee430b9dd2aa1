"""The pipeline at real sizes (issue 60): a ~0.5B Llama-shaped checkpoint and files of 20k, 200k and 1M rows
through `rlhf run --only data_prep,sft`, with `datasets.map` preparing the same files side by side.

    python -m benchmarks run scale [--scale-rows 20000,200000,1000000] [--scale-model 0.5b|50m]
                                   [--scale-cache DIR] [--overrides KEY=VALUE ...] [--workdir DIR]

What it makes (once per seed and shape, cached in `--scale-cache`, default ~/.cache/rlhf-benchmarks/scale;
a rerun reuses it):

- a checkpoint folder: a byte-level BPE tokenizer (the `tokenizers` library) trained on the generated
  text with a ChatML chat template, and a LlamaForCausalLM with random weights (normal(0, 0.02), norms 1)
  drawn from the seed tensor by tensor and written as one fp32 safetensors file: `0.5b` is ~0.5B
  parameters (~2 GB), `50m` ~60M (a quick check of the harness);
- per row count, JSONL files of pseudo-words drawn from the seed (row i is the same whatever the count):
  sft.jsonl `{"prompt", "response"}` (20 and 49 words: ~650 bytes, every row the same length), preference.jsonl `{"prompt", "chosen",
  "rejected"}`, prompts.jsonl `{"prompt", "label"}`.

For each row count, in a fresh state folder (nothing cached across sizes), a config of `data.source:
files` with `model.name_or_path` at the checkpoint runs `rlhf run --only data_prep,sft` with
`sft.max_steps=2` (micro-batch 1, `data.max_len` 512, no gradient checkpointing; 8 rows of each set held
out, so eval costs the same at every size). Per stage, from its MLflow run: wall time (the run's span),
compute (the `rlhf.compute_span` tag: the stage function) and overhead (the rest: actor start-up,
downloads, hashing, publishing). SFT's time to its first optimizer step is its run's `time/first_step_s` metric
(the trainer's; a stage from before that metric: derived from the first `[sft] step N/M ... | R it/s` line the
stage worker prints, the line's arrival time less N - 1 mean steps of 1/R, with the uncertainty R's two
decimals leave, `first_step`).
Bytes: the stage run's artifact folder in the store, and the download cache copies of its inputs
(`<state>/downloads/<run>/<name>`); the whole state folder's subfolders before and after are in the JSON.
Memory: every process under the `rlhf` command every 0.2 s, each given a role from its command line
(driver, stage worker: a Ray actor `ray::...`, raylet, gcs_server, Prefect server, ...): its peak RSS since
the last look, exact (the kernel's high-water mark `VmHWM`, reset after each read by writing 5 to
`/proc/PID/clear_refs`, so a transient peak between two looks is not missed), its RSS and anonymous RSS at
the look; a stage's peaks are those of the looks while its MLflow run was open: its largest stage-worker
process, and the whole tree (the sum of RSS at one look; RSS counts pages shared by forked processes in each).

Side by side, in a subprocess sampled the same way: HF `datasets` loading each JSONL file and
`datasets.map` (num_proc = the cores) rendering it with the same tokenizer's chat template and
tokenizing it the way TRL's trainers do (prompt with the generation prompt, then the whole
conversation; the completion mask from the prompt's length; truncated at max_len), with a fresh cache.

Then the pinned checkpoint, in the smallest size's state folder: the same `rlhf run --only data_prep`
again (everything cached: the rerun's cost), and twice with `inputs.sft_model` pinned to the unchanged
checkpoint folder: the time each adds over the plain rerun, and the bytes the store and the download
cache gain.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import Report, RunOptions

REPO_ROOT = Path(__file__).resolve().parents[1]
ROWS = (20_000, 200_000, 1_000_000)
SEED = 60
VERSION = 2  # of the generated files and checkpoint: in their cache folders' names (a new generator, new folders)
CHUNK = 1000  # rows drawn per random stream: row i is the same whatever the row count
N_WORDS = 30_000
VOCAB = 32_000  # the BPE trainer's target; the model's vocabulary is what it reaches
TOKENIZER_ROWS = 20_000  # SFT rows the tokenizer is trained on
MAX_LEN = 512
EVAL_ROWS = 8  # held out per dataset at every size (sft evaluates them at its last step)
SAMPLE_EVERY_S = 0.2
MiB = 2**20
CLEAN_ENV = ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "PREFECT_API_URL")
# Llama shapes: 0.5b ~ 413M in the layers + 2 x 1280 x vocab in the (untied) embeddings
MODELS: dict[str, dict[str, Any]] = {
    "0.5b": {"hidden_size": 1280, "intermediate_size": 3456, "num_hidden_layers": 24, "num_attention_heads": 20,
             "num_key_value_heads": 4},
    "50m": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8,
            "num_key_value_heads": 8},
}
KINDS = ("sft", "preference", "prompts")
# words per text: prompt, response (a preference row has two responses), drawn from these ranges
PROMPT_WORDS, RESPONSE_WORDS = (14, 26), (37, 61)
# an SFT row's, always: the two rows SFT draws then cost the same at every size (at micro-batch 1 a step's
# activations follow its row's length, hundreds of MiB for a 0.5B model), so its growth is the data's alone
SFT_WORDS = (20, 49)
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


# ---------------------------------------------------------------- the generated text


@functools.lru_cache(maxsize=4)
def vocabulary(seed: int) -> tuple[list[str], Any]:
    """N_WORDS distinct pseudo-words and the cumulative Zipf weights they are drawn with."""
    import numpy as np

    rng = np.random.default_rng([seed, 0])
    onsets = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "st", "tr", "ch", "sh"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    codas = ["", "", "", "n", "r", "s", "t", "l", "m"]
    syllables = [o + v + c for o in onsets for v in vowels for c in codas]
    words: dict[str, None] = {}
    while len(words) < N_WORDS:  # a batch of candidates at a time, duplicates dropped, in the order drawn
        counts, picks = rng.integers(1, 5, 4096).tolist(), rng.integers(0, len(syllables), (4096, 4)).tolist()
        for n, pick in zip(counts, picks, strict=True):
            words.setdefault("".join(syllables[i] for i in pick[:n]))
    words_list = list(words)[:N_WORDS]
    weights = 1.0 / (np.arange(N_WORDS) + 2.7)
    return words_list, np.cumsum(weights / weights.sum())


def chunk_rows(kind: str, seed: int, chunk: int) -> list[dict]:
    """Rows [chunk * CHUNK, (chunk + 1) * CHUNK) of `kind`, from their own random stream."""
    import numpy as np

    words, cdf = vocabulary(seed)
    rng = np.random.default_rng([seed, 1 + KINDS.index(kind), chunk])
    responses = 2 if kind == "preference" else (1 if kind == "sft" else 0)
    if kind == "sft":
        lengths = [np.full(CHUNK, words) for words in SFT_WORDS]
    else:
        lengths = [rng.integers(*PROMPT_WORDS, CHUNK)] + [rng.integers(*RESPONSE_WORDS, CHUNK) for _ in range(responses)]
    picks = np.searchsorted(cdf, rng.random(int(sum(int(x.sum()) for x in lengths)))).clip(max=N_WORDS - 1)
    flat = [words[i] for i in picks.tolist()]
    labels = rng.integers(0, 1000, CHUNK).tolist()
    out, at = [], 0
    for r in range(CHUNK):
        texts = []
        for lens in lengths:
            n = int(lens[r])
            texts.append(" ".join(flat[at : at + n]))
            at += n
        if kind == "sft":
            out.append({"prompt": texts[0], "response": texts[1]})
        elif kind == "preference":
            out.append({"prompt": texts[0], "chosen": texts[1], "rejected": texts[2]})
        else:
            out.append({"prompt": texts[0], "label": str(labels[r])})
    return out


def rows(kind: str, seed: int, n: int) -> Iterator[dict]:
    """The first `n` rows of `kind` for `seed`: the same rows at any `n` (a smaller set is a prefix)."""
    for chunk in range((n + CHUNK - 1) // CHUNK):
        yield from chunk_rows(kind, seed, chunk)[: n - chunk * CHUNK]


@contextlib.contextmanager
def built(target: Path) -> Iterator[Path]:
    """A folder made in a temporary sibling and renamed into place when the block ends without error."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def dataset_files(cache: Path, seed: int, n: int) -> dict[str, Path]:
    """The three JSONL files of `n` rows, generated once into `cache`."""
    folder = cache / f"data-v{VERSION}-seed{seed}" / f"rows-{n}"
    if not folder.is_dir():
        started = time.monotonic()
        with built(folder) as tmp:
            for kind in KINDS:
                with open(tmp / f"{kind}.jsonl", "w") as out:
                    for row in rows(kind, seed, n):
                        out.write(json.dumps(row) + "\n")
        print(f"[scale] generated {n:,} rows of each set in {time.monotonic() - started:.0f} s: {folder}", flush=True)
    return {kind: folder / f"{kind}.jsonl" for kind in KINDS}


# ---------------------------------------------------------------- the checkpoint


def train_tokenizer(seed: int, folder: Path) -> None:
    """A byte-level BPE tokenizer trained on the generated SFT text, with the ChatML template, saved to `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = (text for row in rows("sft", seed, TOKENIZER_ROWS) for text in (row["prompt"], row["response"]))
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHATML)
    fast.save_pretrained(folder)


def build_checkpoint(folder: Path, shape: dict[str, Any], seed: int) -> int:
    """Tokenizer and random weights into `folder` (the model is laid out on the meta device, its tensors
    drawn one by one: no init pass); returns the parameter count."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    train_tokenizer(seed, folder)
    tok = AutoTokenizer.from_pretrained(folder)
    config = LlamaConfig(vocab_size=len(tok), max_position_embeddings=2048, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **shape)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, meta in model.state_dict().items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(meta.shape)
        else:
            tensors[name] = torch.empty(meta.shape).normal_(0.0, 0.02, generator=generator)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(folder)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(folder)
    return sum(t.numel() for t in tensors.values())


def checkpoint(cache: Path, model: str, seed: int) -> tuple[Path, int]:
    """The checkpoint folder of shape `model` for `seed` (built once into `cache`) and its parameter count."""
    folder = cache / f"model-v{VERSION}-{model}-seed{seed}"
    if not folder.is_dir():
        started = time.monotonic()
        with built(folder) as tmp:
            params = build_checkpoint(tmp, MODELS[model], seed)
            (tmp / "params.txt").write_text(f"{params}\n")
        print(f"[scale] built the {model} checkpoint ({params / 1e6:,.0f}M parameters) in "
              f"{time.monotonic() - started:.0f} s: {folder}", flush=True)
    return folder, int((folder / "params.txt").read_text())


# ---------------------------------------------------------------- running a command and watching it


STAGE_WORKER, WORKER_CHILD = "stage worker", "stage worker's child"
# a process's program (its first argument's last part) -> its role
PROGRAMS = {"raylet": "raylet", "gcs_server": "gcs_server"}
# a word in the command line of a Python process -> its role
SCRIPTS = (("default_worker.py", "ray idle worker"), ("prefect", "prefect server"), ("dashboard", "ray dashboard"),
           ("log_monitor", "ray log monitor"), ("runtime_env", "ray runtime env agent"), ("monitor.py", "ray monitor"),
           ("mlflow", "mlflow"))


def role(cmdline: list[str], is_root: bool, parent: str | None = None) -> str:
    """What a process of the `rlhf` tree is, from its command line and its parent's role: a process a stage
    worker started (data prep's pool of `data.num_proc` processes, forked with the worker's title) is its child."""
    if is_root:
        return "driver"
    if parent in (STAGE_WORKER, WORKER_CHILD):
        return WORKER_CHILD
    line = " ".join(cmdline)
    if line.startswith("ray::"):
        return "ray idle worker" if line.startswith("ray::IDLE") else STAGE_WORKER
    if cmdline and (program := PROGRAMS.get(cmdline[0].rsplit("/", 1)[-1])):  # before the words: the raylet's
        return program  # arguments name the worker script
    for needle, name in SCRIPTS:
        if needle in line:
            return name
    return "other"


@dataclass
class Watched:
    """A finished command: its wall time, its output lines with their arrival times, and RSS samples."""

    wall_s: float
    started: float  # Unix seconds
    lines: list[tuple[float, str]] = field(default_factory=list)
    # (Unix time, pid, role, RSS bytes, anonymous RSS bytes, peak RSS bytes since the last sample) for each
    # process of the tree at each sample
    samples: list[tuple[float, int, str, int, int, int]] = field(default_factory=list)
    commands: dict[int, str] = field(default_factory=dict)  # pid -> its last command line seen (cut short)
    load: list[float] = field(default_factory=list)  # the machine's 1-minute load average, each sample

    def load_range(self) -> list[float]:
        """The lowest and highest load average seen while it ran (other work on the machine shows here)."""
        return [min(self.load), max(self.load)] if self.load else []

    def processes(self) -> list[dict]:
        """Each process seen: its role(s), command line and peak RSS (and anonymous RSS), largest first."""
        seen: dict[int, dict] = {}
        for _, pid, name, _, anon, peak in self.samples:
            entry = seen.setdefault(pid, {"pid": pid, "roles": [], "peak_mib": 0.0, "peak_anon_mib": 0.0,
                                          "cmdline": self.commands.get(pid, "")})
            if name not in entry["roles"]:
                entry["roles"].append(name)
            entry["peak_mib"] = max(entry["peak_mib"], peak / MiB)
            entry["peak_anon_mib"] = max(entry["peak_anon_mib"], anon / MiB)
        return sorted(seen.values(), key=lambda e: -e["peak_mib"])

    def peaks(self, span: tuple[float, float] | None = None) -> dict:
        """Per role: the largest process's peak RSS (exact: the kernel's high-water marks), its largest
        anonymous RSS at a sample (what it allocated, without the pages of the files it maps, which the kernel
        can drop) and the role's largest sum of RSS over one sample; and the tree's."""
        chosen = [s for s in self.samples if span is None or span[0] <= s[0] <= span[1]]
        by_time: dict[float, list[tuple[int, str, int, int, int]]] = {}
        for t, pid, name, rss, anon, peak in chosen:
            by_time.setdefault(t, []).append((pid, name, rss, anon, peak))
        roles: dict[str, dict[str, float]] = {}
        tree = 0
        for procs in by_time.values():
            tree = max(tree, sum(rss for _, _, rss, _, _ in procs))
            sums: dict[str, int] = {}
            for _, name, rss, anon, peak in procs:
                sums[name] = sums.get(name, 0) + rss
                entry = roles.setdefault(name, {"process_mib": 0.0, "process_anon_mib": 0.0, "sum_mib": 0.0})
                entry["process_mib"] = max(entry["process_mib"], peak / MiB)
                entry["process_anon_mib"] = max(entry["process_anon_mib"], anon / MiB)
            for name, total in sums.items():
                roles[name]["sum_mib"] = max(roles[name]["sum_mib"], total / MiB)
        return {"tree_mib": tree / MiB, "roles": roles}


def resident(p) -> tuple[int, int, int]:
    """A psutil process's resident bytes, those of them it allocated itself (anonymous: RSS less the pages
    of files and shared memory it maps, Linux's `shared` count), and its peak resident bytes since the last
    call: the kernel's high-water mark, then reset (the RSS when the mark cannot be read or reset)."""
    mem = p.memory_info()
    return mem.rss, mem.rss - mem.shared, max(mem.rss, high_water_mark(p.pid))


def high_water_mark(pid: int) -> int:
    """Process `pid`'s peak RSS in bytes since it started or since the last call, whose mark this resets
    (0 when the process is gone or not ours)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            kib = next((int(line.split()[1]) for line in status if line.startswith("VmHWM:")), 0)
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")  # Linux: reset the peak RSS to the current RSS
    except (OSError, ValueError):
        return 0
    return kib * 1024


def watch(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> Watched:
    """Run `cmd`, time-stamp its output lines into `log` and sample its process tree's RSS."""
    import psutil

    started, t0 = time.time(), time.monotonic()
    result = Watched(0.0, started)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1)
    root = psutil.Process(proc.pid)
    last: dict[int, str] = {}  # pid -> its role at the last sample
    root_cmdline = root.cmdline()

    def sample() -> None:
        while proc.poll() is None:
            now = time.time()
            result.load.append(os.getloadavg()[0])
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            roles: dict[int, str] = {}
            for p in procs:  # parents before their children
                try:  # the command line read each time: a Ray worker takes its actor's title once it has one
                    cmdline = p.cmdline()
                    if not cmdline and p.pid in last:  # exiting: it keeps the role it had
                        roles[p.pid] = last[p.pid]
                    elif p.pid != root.pid and cmdline == root_cmdline:  # forked, not yet the program it runs
                        roles[p.pid] = "driver's fork (before exec)"
                    else:
                        roles[p.pid] = role(cmdline, p.pid == root.pid, roles.get(p.ppid()))
                        result.commands[p.pid] = " ".join(cmdline)[:300]
                    result.samples.append((now, p.pid, roles[p.pid], *resident(p)))
                except psutil.Error:  # exited between the listing and the read
                    pass
            last.update(roles)
            time.sleep(SAMPLE_EVERY_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stdout is not None
    with open(log, "w", buffering=1) as out:  # line by line: the log can be followed while it runs
        for line in proc.stdout:
            result.lines.append((time.time(), line.rstrip("\n")))
            out.write(line)
    proc.wait()
    sampler.join()
    result.wall_s = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed, exit {proc.returncode}:\n{log.read_text()[-4000:]}")
    return result


def du(path: Path) -> int:
    """Bytes of the files under `path` (a file's own size; 0 when absent; a hard link counted once)."""
    if path.is_file():
        return path.stat().st_size
    seen, total = set(), 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def folder_sizes(state: Path) -> dict[str, int]:
    return {p.name: du(p) for p in sorted(state.iterdir())} if state.is_dir() else {}


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env["HF_HOME"] = str(home)  # the datasets cache and hub cache of this size only (measured with the rest)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"  # each line as it is printed: its arrival time is when it was printed
    return env


# ---------------------------------------------------------------- one size through `rlhf run`


def config(ckpt: Path, files: dict[str, Path], state: Path, seed: int) -> dict:
    held = {"eval_ratio": 1e-9, "eval_min_rows": EVAL_ROWS}  # EVAL_ROWS at every size
    return {
        "seed": seed,
        "model": {"name_or_path": str(ckpt)},
        "data": {
            "source": "files",
            "max_len": MAX_LEN,
            "sft": {"paths": [str(files["sft"])], "input_key": "prompt", "output_key": "response", **held},
            "preference": {"paths": [str(files["preference"])], "input_key": "prompt", "chosen_key": "chosen",
                           "rejected_key": "rejected", **held},
            "prompts": {"paths": [str(files["prompts"])], "input_key": "prompt", "label_key": "label", **held},
        },
        "sft": {"max_steps": 2, "micro_batch_size": 1, "gradient_checkpointing": False, "eval_every": 1000,
                "save_every": 1000},
        "tracking": {"state_dir": str(state)},
    }


STEP_LINE = re.compile(r"\[sft\] step (\d+)/(\d+) .*\| ([\d.]+) it/s")


RATE_ROUNDING = 0.005  # the progress line prints it/s with 2 decimals
FIRST_STEP_METRIC = "time/first_step_s"  # the trainer's: from the stage function's start to its first step's end


def first_step(lines: list[tuple[float, str]], compute_start: float) -> dict:
    """SFT's seconds from its stage function's start to the end of its first optimizer step, from its first
    progress line (`[sft] step N/M ... | R it/s`, printed as step N ends; no metric records the first step):
    the line's time less N - 1 mean steps (1/R each). `first_step_error_s`: what R's rounding to 2 decimals
    leaves uncertain (0 at N = 1: `--overrides sft.max_steps=1` makes the measure exact; None when R < 0.01)."""
    for t, line in lines:
        if found := STEP_LINE.search(line):
            steps, rate = int(found[1]), float(found[3])
            to_step = t - compute_start
            out = {"to_step_s": to_step, "step": steps, "rate": rate}
            if steps == 1:
                return {**out, "first_step_s": to_step, "first_step_error_s": 0.0}
            if rate <= RATE_ROUNDING:
                return {**out, "first_step_s": None, "first_step_error_s": None}
            error = (steps - 1) * (1 / (rate - RATE_ROUNDING) - 1 / (rate + RATE_ROUNDING)) / 2
            return {**out, "first_step_s": to_step - (steps - 1) / rate, "first_step_error_s": error}
    return {}


def outcomes(state: Path) -> dict[str, tuple[str, str | None]]:
    """stage -> (status, MLflow run id) in the state folder's newest pipeline run."""
    from mlflow import MlflowClient

    from flows.cli.runs import pipeline_runs, stage_outcomes

    client = MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlhf-pipeline")
    if exp is None:
        raise LookupError(f"{state}: no pipeline run in its MLflow store")
    (parent,) = pipeline_runs(client, exp.experiment_id, 1)
    return stage_outcomes(parent)


def stage_measures(state: Path, watched: Watched) -> list[dict]:
    """What each stage that ran in the state folder's newest pipeline run took: time, bytes, memory."""
    from mlflow import MlflowClient

    from artifacts import run_tags, store

    client = MlflowClient(f"sqlite:///{state / 'mlflow.db'}")
    out = []
    for stage, (status, run_id) in outcomes(state).items():
        if status != "ran" or run_id is None:
            continue
        run = client.get_run(run_id)
        span = (run.info.start_time / 1000, run.info.end_time / 1000)
        compute = tuple(float(t) for t in run.data.tags[run_tags.TAG_COMPUTE_SPAN].split())
        artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
        downloads = [state / "downloads" / ref.run_id / ref.name
                     for ref in map(store.ArtifactRef.parse, store.run_inputs(run).values())]
        measure = {"stage": stage, "wall_s": span[1] - span[0], "compute_s": compute[1] - compute[0],
                   "span": span, "compute": compute, "store_bytes": du(artifacts),
                   "download_bytes": sum(du(p) for p in downloads), **watched.peaks(span),
                   # what its worker printed, seconds after its run opened (data prep's timings, SFT's progress)
                   "lines": [(round(t - span[0], 2), line[line.index(f"[{stage}]"):]) for t, line in watched.lines
                             if f"[{stage}]" in line and "(StageWorker" in line]}
        if stage == "sft":
            measure.update(first_step(watched.lines, compute[0]))
            if (logged := run.data.metrics.get(FIRST_STEP_METRIC)) is not None:  # the trainer's own, exact
                measure.update(first_step_s=logged, first_step_error_s=0.0, first_step_from="metric")
        out.append(measure)
    return sorted(out, key=lambda m: m["span"][0])


def run_size(folder: Path, ckpt: Path, files: dict[str, Path], seed: int, overrides: list[str]) -> dict:
    """`rlhf run --only data_prep,sft` on one size in a fresh state folder."""
    import yaml

    folder.mkdir(parents=True)
    state = folder / "state"
    cfg = folder / "scale.yaml"
    cfg.write_text(yaml.safe_dump(config(ckpt, files, state, seed), sort_keys=False))
    env = cli_env(folder / "hf_home")
    before = folder_sizes(state)
    watched = watch([sys.executable, "-m", "flows.cli.main", "run", "--config", str(cfg), "--only", "data_prep,sft",
                     *overrides], folder, env, folder / "run.log")
    return {"wall_s": watched.wall_s, "stages": stage_measures(state, watched), "peaks": watched.peaks(),
            "processes": watched.processes(), "load_avg": watched.load_range(), "state_before": before,
            "state_after": folder_sizes(state),
            "hf_home_bytes": du(folder / "hf_home")}


def pinned(folder: Path, ckpt: Path, overrides: list[str]) -> list[dict]:
    """In a size's folder after its run: `--only data_prep` again (all cached), then twice with
    `inputs.sft_model` pinned to the checkpoint folder; each one's wall time and the state folder's growth."""
    state = folder / "state"
    env = cli_env(folder / "hf_home")
    out = []
    for label, extra in (("rerun", []), ("pin-1", [f"inputs.sft_model={ckpt}"]), ("pin-2", [f"inputs.sft_model={ckpt}"])):
        before = folder_sizes(state)
        watched = watch([sys.executable, "-m", "flows.cli.main", "run", "--config", str(folder / "scale.yaml"), "--only",
                         "data_prep", *overrides, *extra], folder, env, folder / f"{label}.log")
        out.append({"run": label, "wall_s": watched.wall_s, "state_before": before, "state_after": folder_sizes(state),
                    "tree_mib": watched.peaks()["tree_mib"], "load_avg": watched.load_range(),
                    "ran": [stage for stage, (status, _) in outcomes(state).items() if status == "ran"]})
        print(f"[scale] {label}: {watched.wall_s:.1f} s", flush=True)
    return out


# ---------------------------------------------------------------- the reference: datasets.map, the TRL way


def reference_main(argv: list[str]) -> int:
    """`python -m benchmarks.scale reference TOKENIZER CACHE OUT KIND=FILE ...`: load and map each file, the
    seconds of each written to OUT as JSON."""
    tokenizer_dir, cache, out, *pairs = argv
    os.environ["HF_DATASETS_CACHE"] = cache
    import datasets
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    num_proc = os.cpu_count() or 1
    result: dict[str, Any] = {"num_proc": num_proc}
    for pair in pairs:
        kind, path = pair.split("=", 1)
        started = time.monotonic()
        ds = datasets.load_dataset("json", data_files=path, split="train", cache_dir=cache)
        loaded = time.monotonic()
        mapped = ds.map(MAPS[kind], fn_kwargs={"tok": tok}, num_proc=num_proc, remove_columns=ds.column_names)
        result[kind] = {"rows": len(mapped), "load_s": loaded - started, "map_s": time.monotonic() - loaded}
    Path(out).write_text(json.dumps(result))
    return 0


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _prompt(tok, prompt: str) -> tuple[list[dict], str]:
    messages = [{"role": "user", "content": prompt}]
    return messages, tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _conversation(tok, messages: list[dict], prompt_text: str, response: str) -> dict:
    full = tok.apply_chat_template([*messages, {"role": "assistant", "content": response}], tokenize=False)
    prompt_ids, ids = _ids(tok, prompt_text), _ids(tok, full)
    mask = [0] * len(prompt_ids) + [1] * (len(ids) - len(prompt_ids))
    return {"input_ids": ids[:MAX_LEN], "completion_mask": mask[:MAX_LEN]}


def map_sft(row: dict, tok) -> dict:
    messages, prompt_text = _prompt(tok, row["prompt"])
    return _conversation(tok, messages, prompt_text, row["response"])


def map_preference(row: dict, tok) -> dict:
    messages, prompt_text = _prompt(tok, row["prompt"])
    chosen, rejected = (_conversation(tok, messages, prompt_text, row[k]) for k in ("chosen", "rejected"))
    return {"chosen_input_ids": chosen["input_ids"], "chosen_mask": chosen["completion_mask"],
            "rejected_input_ids": rejected["input_ids"], "rejected_mask": rejected["completion_mask"]}


def map_prompts(row: dict, tok) -> dict:
    _, prompt_text = _prompt(tok, row["prompt"])
    return {"prompt_ids": _ids(tok, prompt_text)[:MAX_LEN], "label": row["label"]}


MAPS = {"sft": map_sft, "preference": map_preference, "prompts": map_prompts}


def reference(folder: Path, ckpt: Path, files: dict[str, Path]) -> dict:
    folder.mkdir(parents=True)
    out = folder / "reference.json"
    watched = watch([sys.executable, "-m", "benchmarks.scale", "reference", str(ckpt), str(folder / "hf_datasets"),
                     str(out), *(f"{kind}={path}" for kind, path in files.items())], REPO_ROOT, cli_env(folder / "hf_home"),
                    folder / "reference.log")
    result = {"wall_s": watched.wall_s, **json.loads(out.read_text()), "peaks": watched.peaks(), "load_avg": watched.load_range(),
              "cache_bytes": du(folder / "hf_datasets")}
    shutil.rmtree(folder / "hf_datasets", ignore_errors=True)  # measured; at 1M rows it is GBs the next size needs
    return result


# ---------------------------------------------------------------- the tables (from the JSON alone)


def mb(n: float) -> str:
    return f"{n / 1e6:,.0f}"


def size_label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else (f"{n // 1000}k" if n % 1000 == 0 else f"{n:,}")


def _f(value: float | None, fmt: str = "{:.1f}") -> str:
    return "" if value is None else fmt.format(value)


COLUMNS = ["rows", "stage", "wall s", "compute s", "overhead s", "to 1st step s", "store MB", "download cache MB",
           "worker peak RSS MiB", "worker peak anon MiB", "tree peak RSS MiB"]


def first_step_cell(m: dict) -> str:
    """`12.3`, `12.3 ± 0.4` where the printed rate's rounding leaves it uncertain, or `< 80.1` (the line's time)
    where the rate is too low to tell."""
    if "to_step_s" not in m:
        return ""
    if m.get("first_step_s") is None:
        return f"< {m['to_step_s']:.1f}"
    error = m.get("first_step_error_s") or 0.0
    return f"{m['first_step_s']:.1f}" + (f" ± {error:.1f}" if error >= 0.05 else "")


def stage_row(n: int, m: dict) -> list[str]:
    worker = m["roles"].get("stage worker", {})
    return [size_label(n), m["stage"], _f(m["wall_s"]), _f(m["compute_s"]), _f(m["wall_s"] - m["compute_s"]),
            first_step_cell(m), mb(m["store_bytes"]), mb(m["download_bytes"]), _f(worker.get("process_mib"), "{:,.0f}"),
            _f(worker.get("process_anon_mib"), "{:,.0f}"), _f(m["tree_mib"], "{:,.0f}")]


def reference_row(n: int, ref: dict) -> list[str]:
    kinds = [k for k in KINDS if k in ref]
    load, mapped = sum(ref[k]["load_s"] for k in kinds), sum(ref[k]["map_s"] for k in kinds)
    largest = max((r["process_mib"] for r in ref["peaks"]["roles"].values()), default=0.0)
    anon = [r["process_anon_mib"] for r in ref["peaks"]["roles"].values() if "process_anon_mib" in r]
    return [size_label(n), f"datasets.map ({ref['num_proc']} procs): load + map", _f(load + mapped), _f(mapped),
            _f(load), "", "", mb(ref["cache_bytes"]), f"{largest:,.0f}", f"{max(anon):,.0f}" if anon else "",
            f"{ref['peaks']['tree_mib']:,.0f}"]


def growth_rows(sizes: list[dict]) -> list[list[str]]:
    """Largest size against smallest, stage by stage: times as ratios, bytes and memory as differences."""
    if len(sizes) < 2:
        return []
    small, large = sizes[0], sizes[-1]
    label = f"{size_label(small['rows'])} → {size_label(large['rows'])}"
    out = []
    by_stage = {m["stage"]: m for m in small["stages"]}
    for m in large["stages"]:
        s = by_stage.get(m["stage"])
        if s is None:
            continue

        def ratio(key: str, a: dict = s, b: dict = m) -> str:
            x, y = a.get(key), b.get(key)
            return f"×{y / x:.2f}" if x and y is not None else ""  # x None or 0, or y None: not measured

        def diff(a: float | None, b: float | None, scale: float = 1.0, unit: str = "") -> str:
            return "" if a is None or b is None else f"{(b - a) / scale:+,.0f}{unit}"

        over_s, over_l = s["wall_s"] - s["compute_s"], m["wall_s"] - m["compute_s"]
        worker = [x["roles"].get("stage worker", {}).get("process_mib") for x in (s, m)]
        anon = [x["roles"].get("stage worker", {}).get("process_anon_mib") for x in (s, m)]
        out.append([label, f"{m['stage']} growth", ratio("wall_s"), ratio("compute_s"),
                    f"×{over_l / over_s:.2f}" if over_s > 0 else "", ratio("first_step_s"),
                    diff(s["store_bytes"], m["store_bytes"], 1e6), diff(s["download_bytes"], m["download_bytes"], 1e6),
                    diff(worker[0], worker[1]), diff(anon[0], anon[1]), diff(s["tree_mib"], m["tree_mib"])])
    return out


def main_table(data: dict) -> tuple[list[str], list[list[str]]]:
    rows_out: list[list[str]] = []
    for size in data["sizes"]:
        rows_out += [stage_row(size["rows"], m) for m in size["stages"]]
        rows_out.append([size_label(size["rows"]), "rlhf run (whole command)", _f(size["wall_s"]), "", "", "",
                         mb(size["state_after"].get("mlartifacts", 0) - size["state_before"].get("mlartifacts", 0)),
                         mb(size["state_after"].get("downloads", 0) - size["state_before"].get("downloads", 0)), "", "",
                         f"{size['peaks']['tree_mib']:,.0f}"])
        if "reference" in size:
            rows_out.append(reference_row(size["rows"], size["reference"]))
    return COLUMNS, rows_out + growth_rows(data["sizes"])


def roles_table(data: dict) -> tuple[list[str], list[list[str]]]:
    """Peak RSS of each process role over the whole `rlhf run`, by size (the largest process; the role's sum)."""
    sizes = data["sizes"]
    first = ("driver", STAGE_WORKER, WORKER_CHILD)
    # a role whose processes were gone before their memory was read (0 MiB) says nothing
    seen = {r for s in sizes for r, peak in s["peaks"]["roles"].items() if peak["process_mib"] >= 1}
    names = sorted(seen, key=lambda r: (first.index(r) if r in first else 3, r))
    columns = ["process role", *(f"{size_label(s['rows'])}: largest / all MiB" for s in sizes)]
    out = []
    for name in names:
        cells = []
        for s in sizes:
            r = s["peaks"]["roles"].get(name)
            cells.append("" if r is None else f"{r['process_mib']:,.0f} / {r['sum_mib']:,.0f}")
        out.append([name, *cells])
    out.append(["whole tree", *(f"{s['peaks']['tree_mib']:,.0f}" for s in sizes)])
    return columns, out


def pin_table(data: dict) -> tuple[list[str], list[list[str]]]:
    runs = data.get("pin", [])
    base = next((r["wall_s"] for r in runs if r["run"] == "rerun"), None)
    labels = {"rerun": "rerun, nothing changed (all cached)", "pin-1": "+ inputs.sft_model=<the folder>, first time",
              "pin-2": "+ inputs.sft_model=<the folder>, again (unchanged)"}
    out = []
    for r in runs:
        grew = {k: r["state_after"].get(k, 0) - r["state_before"].get(k, 0) for k in ("mlartifacts", "downloads")}
        added = "" if base is None or r["run"] == "rerun" else f"{r['wall_s'] - base:+.1f}"
        out.append([labels.get(r["run"], r["run"]), f"{r['wall_s']:.1f}", added, mb(grew["mlartifacts"]), mb(grew["downloads"]),
                    ", ".join(r.get("ran", [])) or "none"])
    return ["`rlhf run --only data_prep` in the smallest size's state", "wall s", "added s", "store +MB", "download cache +MB",
            "stages that ran"], out


def reports(data: dict) -> dict[str, Report]:
    model = data["model"]
    what = (f"a {model['params'] / 1e6:,.0f}M-parameter Llama ({model['name']}, fp32 safetensors {mb(model['bytes'])} MB) "
            f"and {', '.join(size_label(s['rows']) for s in data['sizes'])} rows of each file")
    loads = [x for s in data["sizes"] for part in (s, s.get("reference", {})) for x in part.get("load_avg", [])]
    if loads:  # a machine busy with other work makes every time here longer
        what += f"; the machine's 1-minute load average while they ran: {min(loads):.1f} to {max(loads):.1f} on {data.get('cpus', '?')} cores"
    main_cols, main_rows = main_table(data)
    role_cols, role_rows = roles_table(data)
    pin_cols, pin_rows = pin_table(data)
    return {
        "scale": Report(f"Scale: `rlhf run --only data_prep,sft` (sft.max_steps=2) with {what}, per stage, and "
                        "`datasets.map` preparing the same files", main_cols, main_rows, data=data),
        "scale-processes": Report(f"Scale: peak RSS per process role over the whole `rlhf run` ({what})", role_cols,
                                  role_rows),
        "scale-pin": Report(f"Scale: the checkpoint folder ({mb(model['bytes'])} MB) pinned again in a second run",
                            pin_cols, pin_rows),
    }


# ---------------------------------------------------------------- the benchmark


def scale(options: RunOptions) -> dict[str, Report]:
    sizes = sorted(options.scale_rows or ROWS)
    cache = Path(options.scale_cache or Path.home() / ".cache" / "rlhf-benchmarks" / "scale").expanduser()
    model = options.scale_model or "0.5b"
    seed = SEED
    ckpt, params = checkpoint(cache, model, seed)
    data: dict = {"model": {"name": model, "params": params, "bytes": du(ckpt), "path": str(ckpt), **MODELS[model]},
                  "seed": seed, "cpus": os.cpu_count(), "max_len": MAX_LEN, "eval_rows": EVAL_ROWS, "overrides": options.overrides, "sizes": []}
    for n in sizes:
        files = dataset_files(cache, seed, n)
        folder = options.workdir / f"scale-{n}"
        print(f"[scale] {n:,} rows: rlhf run --only data_prep,sft", flush=True)
        size = {"rows": n, "file_bytes": {k: du(p) for k, p in files.items()},
                **run_size(folder, ckpt, files, seed, options.overrides)}
        print(f"[scale] {n:,} rows: datasets.map", flush=True)
        size["reference"] = reference(folder / "reference", ckpt, files)
        data["sizes"].append(size)
        print(f"[scale] {n:,} rows: {size['wall_s']:.0f} s for rlhf run, {size['reference']['wall_s']:.0f} s for "
              "datasets.map", flush=True)
    data["pin"] = pinned(options.workdir / f"scale-{sizes[0]}", ckpt, options.overrides)
    return reports(data)


if __name__ == "__main__":
    if sys.argv[1:2] == ["reference"]:
        raise SystemExit(reference_main(sys.argv[2:]))
    raise SystemExit("usage: python -m benchmarks run scale (or: python -m benchmarks.scale reference ...)")
