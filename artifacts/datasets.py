"""Datasets as MLflow run inputs (`MlflowClient.log_inputs`, what `mlflow.log_input` logs): each split
a stage reads (`sft_data/train`, ...) as a dataset named by its artifact, with its split as the
context, the digest of its content data prep recorded, its row count and its columns. The runs list's Dataset column, the
dataset filter and a logged model's "datasets used" read them."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

from mlflow import MlflowClient
from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.entities import Dataset, DatasetInput, InputTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from artifacts.file_hashes import FileHashes
from artifacts.store import ArtifactRef
from configs.schema import FILE_DATASETS

DIGEST_CHARS = 8  # as MLflow's own dataset digests
MANIFEST = "splits.json"  # written by data prep beside its splits (stages/data/prepared.py): rows, digest, first row
RUN_ARTIFACT_SOURCE = "mlflow_run_artifact"  # where no MLflow dataset source reads the artifact store's scheme


def split_entries(folder: Path) -> dict[str, dict]:
    """`{"train": {"rows", "sha256", "first"}, "eval": ...}`: the splits of a dataset artifact as data prep
    recorded them, in name order; read from its manifest, so no split's Arrow files are read or hashed here."""
    path = folder / MANIFEST
    entries = json.loads(path.read_text()) if path.is_file() else {}
    return dict(sorted(entries.items()))


def fetch_manifest(client: MlflowClient, ref: ArtifactRef, root: Path) -> Path:
    """A folder holding the manifest of dataset artifact `ref` alone (`root/<run>/<name>/splits.json`), fetched
    from the store: on a tracking server the driver reads a dataset's digests without its Arrow files."""
    folder = root / ref.run_id / ref.name
    if not (folder / MANIFEST).is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            fetched = Path(client.download_artifacts(ref.run_id, f"{ref.name}/{MANIFEST}", tmp))
            os.replace(fetched, folder / MANIFEST)  # whole or absent, for a run that reads it at once
    return folder


def columns(first_row: dict) -> str | None:
    """The MLflow column schema of a row (`{"mlflow_colspec": [...]}`), None for a row it cannot type."""
    from mlflow.models import infer_signature

    try:
        return json.dumps({"mlflow_colspec": infer_signature([first_row]).inputs.to_dict()})
    except Exception:  # noqa: BLE001 - a schema is a nicety; the digest and row count are what matter
        return None


def source_of(uri: str, ref: ArtifactRef | None, split_path: str) -> tuple[str, str]:
    """(source type, source JSON) of a split: MLflow's own source for the artifact store's URI
    (`local` for a file URI, `s3`, `gs`, ...), else the `runs:/` URI that loads it."""
    try:
        with warnings.catch_warnings():  # MLflow registers the local source twice and says so, every time
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(uri)
        return source._get_source_type(), source.to_json()
    except MlflowException:
        return RUN_ARTIFACT_SOURCE, json.dumps({"uri": f"{ref.identity}/{split_path}" if ref is not None else uri})


def dataset(name: str, split: str, entry: dict, ref: ArtifactRef, artifact_uri: str) -> Dataset:
    """The MLflow dataset entity of split `split` of artifact `name` (run `ref`), whose artifact folder
    lies at `artifact_uri` in the store; `entry` is the split's manifest entry."""
    source_type, source = source_of(f"{artifact_uri}/{split}", ref, split)
    first = entry.get("first")
    return Dataset(name=name, digest=entry["sha256"][:DIGEST_CHARS], source_type=source_type, source=source,
                   schema=columns(first) if first else None, profile=json.dumps({"num_rows": entry["rows"]}))


def dataset_inputs(local: dict[str, Path], refs: dict[str, ArtifactRef], artifact_uris: dict[str, str]) -> list[DatasetInput]:
    """One input per split of each dataset artifact in `local` (its folder), the split as its context
    (`train`, `eval`)."""
    return [DatasetInput(dataset(name, split, entry, refs[name], artifact_uris[name]), [InputTag(MLFLOW_DATASET_CONTEXT, split)])
            for name, folder in local.items() for split, entry in split_entries(folder).items()]


def config_sources(data, seed: int, hash_cache: Path | None = None) -> list[DatasetInput]:
    """What data prep reads (the `data` config section): each file, folder or hub dataset a section names
    (context: the section, `sft`, `preference`, `prompts`, `prm`, `eval_prompts`), digested by content where it is local, or the
    synthetic task (digested by its settings and the seed)."""
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.huggingface_dataset_source import HuggingFaceDatasetSource

    if data.source == "synthetic":
        settings = json.dumps({"seed": seed, **data.synthetic.model_dump(mode="json")}, sort_keys=True)
        code = CodeDatasetSource({"generator": "stages.data_prep.synthetic_task"})
        entity = Dataset(name="synthetic", digest=hashlib.sha256(settings.encode()).hexdigest()[:DIGEST_CHARS],
                         source_type=code._get_source_type(), source=code.to_json())
        return [DatasetInput(entity, [InputTag(MLFLOW_DATASET_CONTEXT, "synthetic")])]
    hashes = FileHashes(hash_cache)
    found = []
    for section in FILE_DATASETS:
        cfg = getattr(data, section)
        for raw in (cfg.paths if cfg is not None else []):
            path = Path(raw.removeprefix("json@")).expanduser()
            if path.exists():
                files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())
                content = hashlib.sha256("".join(hashes.digest(f) for f in files).encode()).hexdigest()
                source_type, source = source_of(path.resolve().as_uri(), None, "")
                entity = Dataset(name=path.name, digest=content[:DIGEST_CHARS], source_type=source_type, source=source)
            else:  # a hub dataset: named, not read here
                hub = HuggingFaceDatasetSource(path=raw, config_name=cfg.subset, split=cfg.split)
                entity = Dataset(name=raw, digest=hashlib.sha256(hub.to_json().encode()).hexdigest()[:DIGEST_CHARS],
                                 source_type=hub._get_source_type(), source=hub.to_json())
            found.append(DatasetInput(entity, [InputTag(MLFLOW_DATASET_CONTEXT, section)]))
    hashes.save()
    return found


def context(dataset_input: DatasetInput) -> str:
    return next((t.value for t in dataset_input.tags if t.key == MLFLOW_DATASET_CONTEXT), "")


def digests(inputs: list[DatasetInput]) -> dict[str, str]:
    """`{"sft_data/train": "1a2b3c4d", ...}` of logged dataset inputs: what a checkpoint was trained on."""
    return {f"{i.dataset.name}/{context(i)}": i.dataset.digest for i in inputs}


def log(client: MlflowClient, run_id: str, inputs: list[DatasetInput], tries: int = 3) -> None:
    """The datasets as the run's inputs. Two stages that start together and read the same dataset (RL and
    DPO both read the prompts) may both insert its row; on SQLite the second insert fails on the unique
    key, and a second try finds the row the other made."""
    if not inputs:
        return
    for attempt in range(tries):
        try:
            client.log_inputs(run_id, datasets=inputs)
            return
        except MlflowException as exc:
            if "UNIQUE constraint failed" not in str(exc) or attempt == tries - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
