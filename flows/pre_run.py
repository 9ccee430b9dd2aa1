"""Every check a run makes before its first stage, in one place. `rlhf run` and `rlhf check` make them
before anything starts; the flow makes them at the start of each flow run too, because a served or
work-pool deployment's run enters there, past the CLI. They read the config, the files it names and
this machine, and answer or not: none starts a stage, a cluster or a server, or writes to the store."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

from configs.errors import PipelineError
from configs.schema import PipelineConfig

_checked: str | None = None  # the request `rlhf run` checked, while it runs its flow in this process


def problems(cfg: PipelineConfig, force: Sequence[str] = (), only: Sequence[str] = ()) -> Iterator[PipelineError]:
    """The one-line error of each check the request fails, in the order `rlhf run` makes them; lazily,
    so a caller that stops at the first makes no further check. `force`, `only`: stage names."""
    for check_one in _checks(cfg, list(force), list(only)):
        try:
            check_one()
        except PipelineError as error:
            yield error


def check(cfg: PipelineConfig, force: Sequence[str] = (), only: Sequence[str] = ()) -> None:
    """Raise the request's first problem: what a run stops on, as one line."""
    if _checked == _request(cfg, force, only):
        return
    first = next(problems(cfg, force, only), None)
    if first is not None:
        raise first


@contextlib.contextmanager
def checked(cfg: PipelineConfig, force: Sequence[str], only: Sequence[str]) -> Iterator[None]:
    """While the block runs, `check` passes this request at once: `rlhf run` has checked it before
    starting Prefect, and its flow, called in this process, would only repeat the work (a dataset load)."""
    global _checked
    _checked = _request(cfg, force, only)
    try:
        yield
    finally:
        _checked = None


def _request(cfg: PipelineConfig, force: Sequence[str], only: Sequence[str]) -> str:
    return "\n".join((cfg.model_dump_json(), ",".join(force), ",".join(only)))


def _checks(cfg: PipelineConfig, force: list[str], only: list[str]) -> list[Callable[[], None]]:
    from artifacts import disk_full, sqlite_store, tracking
    from stages.dag import declaration as dag
    from stages.dag import preflight

    uri = tracking.resolve_uri(cfg.tracking)
    store_file = sqlite_store.sqlite_path(uri)
    return [
        partial(dag.check_request, cfg, force, only),  # real stages and artifacts
        *(partial(check_one, cfg, only) for check_one in preflight.CHECKS),  # files, model, reward, the layout on this machine
        partial(_rollout_engine, cfg),
        partial(tracking.check_reachable, uri),  # MLflow alone retries a refused connection for minutes
        partial(sqlite_store.check, store_file) if store_file else lambda: None,  # a damaged store
        partial(disk_full.check_room, Path(cfg.tracking.state_dir).expanduser().resolve()),  # a full disk
    ]


def _rollout_engine(cfg: PipelineConfig) -> None:
    """vLLM installed where the engine runs (the module imports Ray: only for a config that asks for it)."""
    if cfg.rl.rollout.engine == "vllm":
        from runtime.rollout_engines import check_installed

        check_installed(cfg)
