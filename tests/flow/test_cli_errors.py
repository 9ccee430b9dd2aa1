"""Bad input ends in one clear line and a non-zero exit, before any work starts.

The first test runs the real `rlhf` command in a subprocess; the others call its `main` in this
process (the same code, without paying the interpreter start and imports each time)."""

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

import configs
from configs.schema import TinyModelConfig
from stages.common import checkpoint
from stages.data_prep.tiny_model import build_model
from tests.flow.conftest import CLI, cli_env, run_cli
from tests.markers import cpu_only
from tests.tiny_checkpoint import save_tiny_checkpoint


def assert_one_line_error(result, *fragments: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def assert_no_work_started(workdir: Path):
    assert not (workdir / ".rlhf" / "mlflow.db").exists()
    assert not (workdir / ".rlhf" / "work").exists()


@pytest.fixture(scope="module")
def local_checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(["Compute 1+2\n1+2=3\nAnswer: 3", "hello world"], tmp_path_factory.mktemp("ckpt") / "model")


def files_config(workdir: Path, model: Path, sft_file: Path, prompts_file: Path) -> Path:
    path = workdir / "files.yaml"
    path.write_text(
        f"model:\n  name_or_path: {model}\n"
        f"data:\n  source: files\n"
        f"  sft:\n    paths: [{sft_file}]\n    input_key: question\n    output_key: answer\n"
        f"  prompts:\n    paths: [{prompts_file}]\n    input_key: question\n    label_key: label\n"
    )
    return path


def test_unknown_override_key(workdir):
    line = assert_one_line_error(run_cli(workdir, "run", "sft.lrr=3e-4"), "sft.lrr", "override", "expected one of")
    assert "lr" in line
    assert_no_work_started(workdir)


def test_unknown_key_in_config_file(cli, workdir):
    bad = workdir / "bad.yaml"
    bad.write_text("sft:\n  lrr: 0.1\n")
    assert_one_line_error(cli("run", "--config", str(bad)), str(bad), "sft.lrr")
    assert_no_work_started(workdir)


def test_wrong_type(cli, workdir):
    assert_one_line_error(cli("run", "sft.micro_batch_size=many"), "sft.micro_batch_size", "many")
    assert_no_work_started(workdir)


def test_eval_metric_that_ranks_no_model_or_is_not_reported(cli, workdir):
    assert_one_line_error(cli("run", "eval.metric=perplexity"), "eval.metric", "lower is better", "pick one of reward")
    assert_one_line_error(cli("run", "eval.metric=accuracy", "eval.answer_pattern=null"), "eval.answer_pattern=null",
                          "metric=accuracy checks answers with answer_pattern, which is empty")
    assert_no_work_started(workdir)


def test_unknown_forced_stage(cli, workdir):
    assert_one_line_error(cli("run", "--force", "sftt"), "sftt", "unknown stage")
    assert_no_work_started(workdir)


def test_unknown_only_stage(cli, workdir):
    assert_one_line_error(cli("run", "--only", "rm,evall"), "--only evall", "unknown stage")
    assert_no_work_started(workdir)


def test_vllm_engine_without_vllm(cli, workdir):
    assert_one_line_error(cli("run", "rl.rollout.engine=vllm"), "rl.rollout.engine=vllm", "vLLM is not installed", "rlhf vllm-env")
    assert_no_work_started(workdir)


def test_model_path_that_is_not_a_checkpoint(cli, workdir):
    empty = workdir / "not_a_model"
    empty.mkdir()
    assert_one_line_error(cli("run", f"model.name_or_path={empty}"), str(empty), "not a checkpoint")
    assert_no_work_started(workdir)


def test_dataset_file_missing_its_key(cli, workdir, local_checkpoint):
    sft = workdir / "sft.jsonl"
    sft.write_text('{"question": "Compute 1+2", "response": "3"}\n' * 3)
    prompts = workdir / "prompts.jsonl"
    prompts.write_text('{"question": "Compute 1+2", "label": "3"}\n' * 3)
    cfg = files_config(workdir, local_checkpoint, sft, prompts)
    assert_one_line_error(cli("run", "--config", str(cfg)), str(sft), "'answer'", "data.sft.output_key")
    assert_no_work_started(workdir)


def test_empty_dataset(cli, workdir, local_checkpoint):
    sft = workdir / "sft.jsonl"
    sft.write_text('{"question": "Compute 1+2", "answer": "3"}\n' * 3)
    prompts = workdir / "prompts.jsonl"
    prompts.write_text("")
    cfg = files_config(workdir, local_checkpoint, sft, prompts)
    assert_one_line_error(cli("run", "--config", str(cfg)), str(prompts))
    assert_no_work_started(workdir)


def test_dataset_file_that_is_not_utf8(cli, workdir, local_checkpoint):
    sft = workdir / "sft.jsonl"
    sft.write_bytes('{"question": "Compute 1+2", "answer": "3"}\n{"question": "Caf\xe9?", "answer": "4"}\n'.encode("latin-1"))
    prompts = workdir / "prompts.jsonl"
    prompts.write_text('{"question": "Compute 1+2", "label": "3"}\n' * 3)
    cfg = files_config(workdir, local_checkpoint, sft, prompts)
    assert_one_line_error(cli("run", "--config", str(cfg)), f"{sft} line 2:", "byte 0xe9", "re-encode the file as UTF-8")
    assert_no_work_started(workdir)


def test_more_training_workers_than_local_cpus(cli, workdir):
    assert_one_line_error(cli("run", "infra.num_workers=4", "infra.num_cpus=2"),
                          "infra.num_workers=4", "needs 8 CPUs", "has 2")
    assert_no_work_started(workdir)


@cpu_only
def test_qlora_without_a_gpu(cli, workdir):
    assert_one_line_error(cli("run", "dpo.lora.rank=8", "dpo.lora.load_in_4bit=true"),
                          "dpo.lora.load_in_4bit=true", "needs a CUDA GPU", "plain LoRA")
    assert_no_work_started(workdir)


@cpu_only
def test_flash_attention_without_a_gpu(cli, workdir):
    assert_one_line_error(cli("run", "model.attn_implementation=flash_attention_2"),
                          "flash_attention_2", "needs a CUDA GPU")
    assert_no_work_started(workdir)


@cpu_only
def test_liger_kernels_without_a_gpu(cli, workdir):
    assert_one_line_error(cli("run", "model.use_liger_kernel=true"),
                          "model.use_liger_kernel needs a CUDA GPU (Liger's kernels are Triton)", "model.use_liger_kernel=false")
    assert_no_work_started(workdir)


@pytest.fixture(scope="module")
def adapter(local_checkpoint, tmp_path_factory) -> Path:
    """A LoRA adapter on `local_checkpoint` with non-zero (random) B matrices, so merging changes the weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from stages.common import lora

    base = AutoModelForCausalLM.from_pretrained(local_checkpoint)
    signature = lora.base_signature(base)
    model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules="all-linear", init_lora_weights=False))
    return lora.save_adapter(model, checkpoint.load_tokenizer(local_checkpoint), tmp_path_factory.mktemp("adapter") / "a",
                             None, signature)


def test_merge_writes_a_plain_checkpoint_matching_the_adapter_model(cli, workdir, adapter, local_checkpoint):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    result = cli("merge", "--adapter", str(adapter), "--out", str(workdir / "merged"))
    assert result.returncode == 0, result.stderr
    assert f"merged {adapter} into its base: {workdir / 'merged'}" in result.stdout
    merged = AutoModelForCausalLM.from_pretrained(workdir / "merged")
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(local_checkpoint), adapter)
    ids = torch.arange(3, 20).unsqueeze(0)
    with torch.no_grad():
        assert float((merged(input_ids=ids).logits - peft(input_ids=ids).logits).abs().max()) < 1e-4
    again = cli("merge", "--adapter", str(adapter), "--out", str(workdir / "merged"))
    assert_one_line_error(again, "--out", "already exists")


def test_merge_onto_another_base_or_of_a_full_model_is_one_line(cli, workdir, adapter, local_checkpoint, tmp_path):
    tok = checkpoint.load_tokenizer(local_checkpoint)
    other = build_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2), tok, seed=1)
    checkpoint.save(other, tok, tmp_path / "other")
    wrong = cli("merge", "--adapter", str(adapter), "--base", str(tmp_path / "other"), "--out", str(tmp_path / "m1"))
    assert_one_line_error(wrong, "was trained on another base than", "pass the checkpoint the adapter was trained from")
    full = cli("merge", "--adapter", str(local_checkpoint), "--out", str(tmp_path / "m2"))
    assert_one_line_error(full, "not a LoRA adapter")
    assert not (tmp_path / "m1").exists() and not (tmp_path / "m2").exists()


def test_forcing_a_stage_that_only_reuses(cli, workdir):
    assert_one_line_error(cli("run", "--only", "rm", "--force", "sft"), "--force sft", "--only reuses it")
    assert_no_work_started(workdir)


def test_unknown_stage_in_stage_retries(cli, workdir):
    assert_one_line_error(cli("run", "infra.stage_retries={sfft: 3}"), "infra.stage_retries sfft", "unknown stage")
    assert_no_work_started(workdir)


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        (None, ["reward.func_path=missing.py: no such file"]),
        ("def reward_func(queries, prompts, labels)\n    return [0.0] * len(queries)\n",
         ["reward.func_path=reward.py: line 1: SyntaxError: expected ':'"]),
        ("def score(queries, prompts, labels):\n    return [0.0] * len(queries)\n",
         ["reward.func_path=reward.py: defines no reward_func; define reward_func(queries, prompts, labels)"]),
        ("def reward_func(queries):\n    return [0.0] * len(queries)\n",
         ["reward.func_path=reward.py: line 1: reward_func(queries) takes 1 positional argument, not 3"]),
    ],
    ids=["missing", "syntax", "no_reward_func", "signature"],
)
def test_a_bad_reward_file_stops_the_run_before_any_work(cli, workdir, body, fragments):
    if body is not None:
        (workdir / "reward.py").write_text(body)
    name = "missing.py" if body is None else "reward.py"
    assert_one_line_error(cli("run", f"reward.func_path={name}"), *fragments)
    assert_no_work_started(workdir)


def test_overrides_after_an_option_are_read_as_overrides(cli, workdir):
    assert_one_line_error(cli("run", "seed=7", "--force", "sft", "sft.lrr=3e-4"), "sft.lrr", "override")
    assert_no_work_started(workdir)


@pytest.mark.slow
def test_a_failure_inside_the_flow_is_one_line_and_a_fresh_folder_keeps_no_store(workdir):
    """The flow fails before any stage ran (a pinned input names no run): no Prefect traceback on the
    terminal, the error last, and the store the run made for it is gone."""
    pin = "inputs.rl_model=runs:/0123456789abcdef0123456789abcdef/rl_model"
    result = run_cli(workdir, "run", "--only", "eval", pin, timeout=300)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {pin}: no run 0123456789abcdef0123456789abcdef in sqlite:///"), result.stderr
    assert not (workdir / ".rlhf").exists()


@pytest.mark.parametrize(("uri", "fragments"), [
    ("http://127.0.0.1:9", ["tracking.uri=http://127.0.0.1:9", "no MLflow server answers", "rlhf cluster up"]),
    ("postgresql+psycopg2://rlhf:secret@127.0.0.1:9/mlflow",
     ["tracking.uri=postgresql+psycopg2://rlhf:***@127.0.0.1:9/mlflow", "cannot reach the database at 127.0.0.1:9"]),
])
def test_a_tracking_server_or_database_that_does_not_answer_is_one_line_at_once(cli, workdir, uri, fragments):
    """MLflow alone retries a refused connection for minutes, then prints its traceback."""
    started = time.monotonic()
    line = assert_one_line_error(cli("run", f"tracking.uri={uri}"), *fragments)
    took = time.monotonic() - started
    assert took < 60, f"{took:.0f} s to the error line: the tracking store's connection was retried"
    assert "secret" not in line
    assert not (workdir / ".rlhf").exists()


# --- `rlhf check`: the checks `rlhf run` makes before its first stage, and nothing else ---------------------

OK_LINE = "ok: {} passes every check `rlhf run` makes before its first stage\n"
# what the tiny preset runs (stages/dag/plan.py), read from its config: rs, kd and csft are off, no stage trains
# an adapter
TINY_PLAN = ("stages:\n  data_prep   runs\n  sft         runs\n  rm          runs\n  prm         runs\n  rl          runs\n"
             "  dpo         runs\n  rs          off: rs.enabled is false\n  kd          off: kd.enabled is false\n"
             "  csft        off: csft.enabled is false\n  lora_merge  off: no stage trains a LoRA adapter\n"
             "  eval        runs\n")
REUSED, LEFT_OUT = "reused: --only reads its outputs from an earlier run", "unrequested: --only leaves it out"
ONLY_RM_PLAN = ("stages:\n" + "".join(f"  {name.ljust(12)}{line}\n" for name, line in (
    ("data_prep", REUSED), ("sft", REUSED), ("rm", "runs"), *((name, LEFT_OUT) for name in
    ("prm", "rl", "dpo", "rs", "kd", "csft", "lora_merge", "eval")))))
MISSING_REWARD = "error: reward.func_path=missing.py: no such file (looked from {} and from {})"
TOO_FEW_CPUS = "error: infra.num_workers=4 x infra.cpus_per_worker=2 needs 8 CPUs; the local Ray cluster has 2 (infra.num_cpus)"


def ray_daemons() -> set[int]:
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] in ("raylet", "gcs_server")}


def session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


def test_check_passes_the_tiny_preset_at_once_and_leaves_nothing_running_or_written(workdir):
    """The real command, in a process group of its own: exit 0 within seconds, nothing of its group left
    (a local Ray cluster's daemons would be), no Ray daemon started, no state folder or MLflow store."""
    daemons = ray_daemons()
    started = time.monotonic()
    proc = subprocess.Popen([*CLI, "check"], cwd=workdir, env=cli_env(workdir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err) == (0, OK_LINE.format("tiny") + TINY_PLAN, "")
    took = time.monotonic() - started
    assert took < 60, f"rlhf check took {took:.0f} s: it starts no cluster and loads no model"
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # no process is left in its group
    # nor a Ray daemon of its session that left the group (other tests may start clusters meanwhile)
    assert not [pid for pid in ray_daemons() - daemons if session_of(pid) == proc.pid]
    assert not (workdir / ".rlhf").exists()


def test_check_names_the_config_and_overrides_it_passed(cli, workdir):
    result = cli("check", "--config", "tiny", "seed=7", "--only", "rm")
    assert (result.returncode, result.stdout, result.stderr) == (0, OK_LINE.format("tiny seed=7") + ONLY_RM_PLAN, "")


def test_check_with_a_missing_reward_file_is_one_line_naming_the_key(cli, workdir):
    result = cli("check", "reward.func_path=missing.py")
    assert result.stderr == MISSING_REWARD.format(workdir, Path(configs.__file__).parent) + "\n"
    assert (result.returncode, result.stdout) == (2, "")
    assert_no_work_started(workdir)


def test_check_with_a_layout_that_cannot_fit_the_local_cluster_is_one_line(cli, workdir):
    result = cli("check", "infra.num_workers=4", "infra.num_cpus=2")
    assert (result.returncode, result.stdout, result.stderr) == (2, "", TOO_FEW_CPUS + "\n")
    assert_no_work_started(workdir)


def test_check_lists_every_failed_check_where_run_stops_at_the_first(cli, workdir):
    request = ("--only", "evall,rl", "reward.func_path=missing.py", "infra.num_workers=4", "infra.num_cpus=2")
    unknown_stage = ("error: --only evall: unknown stage (stages: data_prep, sft, rm, prm, rl, dpo, rs, kd, csft, "
                     "lora_merge, eval)")
    checked = cli("check", *request)
    assert checked.returncode == 2
    assert checked.stderr.splitlines() == [unknown_stage, MISSING_REWARD.format(workdir, Path(configs.__file__).parent),
                                           TOO_FEW_CPUS]
    assert assert_one_line_error(cli("run", *request)) == unknown_stage
    assert_no_work_started(workdir)
