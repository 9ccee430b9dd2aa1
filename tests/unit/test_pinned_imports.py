"""A pinned checkpoint from outside the store (`artifacts.imported`) costs nothing when nothing changed: its
files' digests are kept by stamp, a local store references the folder instead of copying it, a consumer
reads it in place (checked against the import's hash), and a hub id is read from a warm hub cache with
`HF_HUB_OFFLINE=1`."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from artifacts import file_hashes, imported, store, tracking
from configs.errors import PipelineError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkpoint(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(file_hashes, "RACY_S", 0.0)  # keep the digests of files written just now
    folder = tmp_path / "my-sft"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(os.urandom(1 << 20))
    return folder


def counting_reads(monkeypatch) -> list[Path]:
    """The files hashed from now on (each a full read of the file)."""
    read: list[Path] = []
    real = file_hashes.sha256
    monkeypatch.setattr(file_hashes, "sha256", lambda path: read.append(path) or real(path))
    return read


def test_a_second_import_of_an_unchanged_folder_reads_no_file_and_an_edit_is_seen(client, tmp_path, checkpoint, monkeypatch):
    cache = tmp_path / "state" / "file_hashes.json"
    first = store.resolve_pin(client, "inputs.sft_model", str(checkpoint), client.exp, cache)
    read = counting_reads(monkeypatch)
    assert store.resolve_pin(client, "inputs.sft_model", str(checkpoint), client.exp, cache) == first
    assert read == []
    weights = checkpoint / "model.safetensors"
    stat = weights.stat()
    with open(weights, "r+b") as f:  # one byte, same size, the mtime put back: only the ctime tells
        f.write(b"\0" if f.read(1) != b"\0" else b"\1")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    edited = store.resolve_pin(client, "inputs.sft_model", str(checkpoint), client.exp, cache)
    assert edited.run_id != first.run_id and read == [weights.resolve()]


def test_a_local_store_references_the_folder_and_its_consumer_reads_it_in_place(client, tmp_path, checkpoint):
    cache = tmp_path / "file_hashes.json"
    ref = store.resolve_pin(client, "inputs.sft_model", str(checkpoint), client.exp, cache)
    run = client.get_run(ref.run_id)
    assert run.data.tags[imported.TAG_PATH] == str(checkpoint.resolve())
    assert not [p for p in (tmp_path / "art").rglob("*") if p.is_file()]  # not a byte of the weights copied
    assert store.download(ref, tmp_path / "downloads", hash_cache=cache) == checkpoint.resolve()
    assert not (tmp_path / "downloads").exists()


def test_a_consumer_never_reads_a_folder_edited_or_gone_since_its_import(client, tmp_path, checkpoint):
    cache = tmp_path / "file_hashes.json"
    ref = store.resolve_pin(client, "inputs.sft_model", str(checkpoint), client.exp, cache)
    (checkpoint / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(PipelineError, match=rf"^{checkpoint.resolve()}: changed since MLflow run {ref.run_id} imported it; rerun"):
        store.download(ref, tmp_path / "downloads", hash_cache=cache)
    moved = tmp_path / "moved"
    checkpoint.rename(moved)
    assert not store.artifacts_present(client, client.get_run(ref.run_id), ["sft_model"])
    with pytest.raises(PipelineError, match=rf"^{checkpoint.resolve()}: gone since MLflow run {ref.run_id} imported it"):
        store.download(ref, tmp_path / "downloads", hash_cache=cache)


def test_the_same_content_in_another_folder_is_the_same_import_read_from_there(client, tmp_path, checkpoint):
    cache = tmp_path / "file_hashes.json"
    ref = store.resolve_pin(client, "inputs.sft_model", str(checkpoint), client.exp, cache)
    moved = checkpoint.rename(tmp_path / "moved")
    assert store.resolve_pin(client, "inputs.sft_model", str(moved), client.exp, cache) == ref  # its consumers stay cached
    assert store.download(ref, tmp_path / "downloads", hash_cache=cache) == moved.resolve()


def test_a_store_without_local_artifacts_gets_a_copy(client, tmp_path, checkpoint, monkeypatch):
    """A tracking server (or an artifact root that is not a local folder) gets the folder copied, once, as
    before: its stage workers may share no disk with this process."""
    monkeypatch.setattr(imported, "referenced", lambda client, run: False)
    ref = store.resolve_pin(client, "inputs.sft_model", str(checkpoint), client.exp)
    run = client.get_run(ref.run_id)
    copied = tracking.artifact_dir(run.info.artifact_uri) / "sft_model"
    assert imported.TAG_PATH not in run.data.tags
    assert sorted(p.name for p in copied.iterdir()) == ["config.json", "model.safetensors"]
    assert store.download(ref, tmp_path / "downloads") == copied  # this machine holds the store: read in place


def test_only_a_local_store_references_folders(client):
    run = client.create_run(client.exp)
    assert imported.referenced(client, run)
    from mlflow import MlflowClient

    assert not imported.referenced(MlflowClient("http://127.0.0.1:1"), run)  # a server: its nodes share no disk


def hub_cache(home: Path, repo: str, commit: str, files: dict[str, bytes]) -> Path:
    """The layout huggingface_hub leaves in `$HF_HOME/hub`: blobs, a snapshot of links to them, `refs/main`."""
    root = home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    for i, (name, data) in enumerate(files.items()):
        (root / "blobs" / f"blob{i}").write_bytes(data)
        (snapshot / name).symlink_to(Path("../..") / "blobs" / f"blob{i}")
    return snapshot


RESOLVE = """
import sys
from mlflow import MlflowClient
from artifacts import store
from configs.errors import PipelineError

client = MlflowClient()
exp = client.create_experiment("e", artifact_location=sys.argv[1])
ref = store.resolve_pin(client, "inputs.reward_model", "org/tiny", exp, None)
run = client.get_run(ref.run_id)
print(run.data.tags["rlhf.import.commit"], run.data.tags["rlhf.import.path"], run.info.run_name,
      run.data.tags["rlhf.import.hash"], sep="\\n")
for missing in ("org/uncached", "/no/such/checkpoint"):
    try:
        store.resolve_pin(client, "inputs.reward_model", missing, exp, None)
    except PipelineError as error:
        print(error)
"""


def test_a_hub_id_in_a_warm_hub_cache_runs_offline_at_its_cached_commit(tmp_path, empty_store):
    commit = "0123456789abcdef0123456789abcdef01234567"
    files = {"config.json": b"{}", "model.safetensors": b"weights"}
    home = tmp_path / ".cache" / "huggingface"  # where the hub cache is by default: its files count all the same
    snapshot = hub_cache(home, "org/tiny", commit, files)
    plain = tmp_path / "plain"
    plain.mkdir()
    for name, data in files.items():
        (plain / name).write_bytes(data)
    (tmp_path / "mlflow.db").write_bytes(empty_store.read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env |= {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    done = subprocess.run([sys.executable, "-c", RESOLVE, (tmp_path / "art").as_uri()], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:5] == [
        commit, str(snapshot.resolve()), f"import · reward_model · org/tiny@{commit[:12]}", imported.content_hash(plain),
        "inputs.reward_model=org/uncached: no such folder, and not in the hub cache while HF_HUB_OFFLINE=1; download "
        "it once with network (`hf download org/uncached`) or give a checkpoint folder",
    ]
    assert lines[5].startswith("inputs.reward_model=/no/such/checkpoint: no such folder, and not a hub model") and len(lines) == 6


class RecordingSession:
    """In place of the Ray session: the stage is a function here that records the inputs it was given and
    writes a checkpoint of 1 MiB."""

    def __init__(self):
        import threading

        self.stopping = threading.Event()
        self.given: dict[str, Path] = {}
        self.written: dict[str, int] = {}

    def run_stage(self, spec, ctx, inputs, files=None):
        from stages.dag.contract import StageResult

        self.given = dict(inputs)
        out = ctx.output_dir / "reward_model"
        out.mkdir()
        (out / "config.json").write_text('{"model_type": "llama"}')
        (out / "model.safetensors").write_bytes(os.urandom(1 << 20))
        self.written = {p.name: p.stat().st_ino for p in out.iterdir()}
        return StageResult(outputs={"reward_model": out}, metrics={"eval/accuracy": 1.0})


def test_a_stage_reads_a_pinned_folder_in_place_and_its_output_is_written_once(client, tmp_path, checkpoint):
    from artifacts.tracking import TrackingSetup
    from configs import load_config
    from flows.stage_task import run_and_publish
    from stages.dag import declaration as dag

    setup = TrackingSetup(uri=client.tracking_uri, experiment="e", state_dir=tmp_path / "state", system_metrics=False)
    pin = store.resolve_pin(client, "inputs.sft_model", str(checkpoint), client.exp, setup.state_dir / "file_hashes.json")
    run_id = client.create_run(client.exp).info.run_id
    session = RecordingSession()
    refs, _ = run_and_publish(dag.BY_NAME["rm"], load_config(None, []), setup, client, run_id, "fp", {"sft_model": pin},
                              setup.state_dir / "work" / "rm-fp", session, client.exp, "")  # type: ignore[arg-type]
    assert session.given == {"sft_model": checkpoint.resolve()}
    assert not (setup.state_dir / "downloads").exists()
    in_store = tracking.artifact_dir(client.get_run(run_id).info.artifact_uri) / refs["reward_model"].name
    kept = {p.name: p.stat().st_ino for p in in_store.iterdir() if p.name != "MLmodel"}
    assert kept == session.written  # moved in: the store's bytes are the stage's, once
    stored = sum(p.stat().st_size for p in (tmp_path / "art").rglob("*") if p.is_file())
    assert stored <= 1.05 * sum(p.stat().st_size for p in in_store.iterdir() if p.name != "MLmodel")
    assert not (setup.state_dir / "work" / "rm-fp").exists()
