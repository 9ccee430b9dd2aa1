"""`rlhf verify RUN_ID [--stages a,b] [--keep]`: the stage runs of a finished pipeline run (or one stage run) rerun
in a scratch folder, one line per stage saying whether its outputs and metrics came out the same.

Exit status: 0 when every stage is identical, 1 when one differs or its rerun failed, 2 for a run id that cannot be
verified (the CLI's one `error:` line). A stop (Ctrl-C, SIGTERM) ends the reruns as it ends `rlhf run`, and the
scratch folder is removed unless `--keep` asks for it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from mlflow import MlflowClient

from artifacts import sqlite_store, tracking
from configs import load_config
from configs.errors import PipelineError
from configs.redaction import redacted
from flows.verify import targets
from flows.verify.compare import Verdict
from flows.verify.rerun import ScratchStore, environment, rerun, scratch_uri, tracking_of

PREFIX = "rlhf-verify-"


def original_store(config: str | None) -> MlflowClient:
    """A client on the store `config` names (default tiny's), read only: nothing is created when it is missing."""
    uri = tracking.resolve_uri(load_config(config).tracking)
    if (path := sqlite_store.sqlite_path(uri)) is not None:
        if not path.exists():
            raise PipelineError(f"no MLflow store at {path}; `rlhf runs` lists the pipeline runs of a store (--config "
                                "names the one to read)")
        sqlite_store.check(path)
    tracking.check_reachable(uri)
    tracking.quiet_store_errors()
    return MlflowClient(uri)


def verify(run_id: str, stages: list[str], keep: bool, config: str | None) -> int:
    original = original_store(config)
    found = targets.find(original, run_id, stages)
    scratch = Path(tempfile.mkdtemp(prefix=PREFIX))
    kept = False
    try:
        verdicts = rerun_all(found, original, scratch)
        kept = keep
    except BaseException:
        kept = keep  # asked for: what the stopped reruns left, to look at
        raise
    finally:
        if kept:
            print(f"[verify] scratch store kept in {scratch} (mlflow ui --backend-store-uri {scratch_uri(scratch)})", flush=True)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"verify {run_id}:", flush=True)
    for result in verdicts:
        print(redacted(result.line()), flush=True)
    return 0 if all(v.identical for v in verdicts) else 1


def rerun_all(found: list[targets.Target], original: MlflowClient, scratch: Path) -> list[Verdict]:
    """Each target rerun in turn, in one Ray session and one Prefect server, as `rlhf run` runs its flow."""
    from prefect.exceptions import ExternalSignal

    from flows import run_end
    from flows.services import ray_cluster
    from flows.services.prefect_server import start_in_background

    uri = scratch_uri(scratch)
    with environment(MLFLOW_TRACKING_URI=uri, MLFLOW_REGISTRY_URI=uri), prefect_home(scratch), run_end.bounded_interrupt():
        store = ScratchStore(scratch, original, tracking_of(found[0]))
        prefect_server = start_in_background()
        try:
            run_end.hide_run_tracebacks()
            run_end.quiet_ray_thread_warning()
            infra = targets.stage_config(found[0].config, list(found[0].overrides)).infra
            with ray_cluster.kept_across_flows(infra):
                if prefect_server is not None:
                    prefect_server.join()
                return [rerun(target, store) for target in found]
        except KeyboardInterrupt as exc:
            raise KeyboardInterrupt(f"verify stopped{during(exc)}") from None
        except ExternalSignal as exc:
            raise run_end.Terminated(f"verify stopped{during(exc)}") from None
        finally:
            if prefect_server is not None:
                prefect_server.join(timeout=run_end.SERVER_START_S)
            run_end.end_prefect(temporary_server=prefect_server is not None)


def during(exc: BaseException) -> str:
    """` (stopped during stage rl)`: where the flow says the stop came, if it said."""
    said = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
    return f" ({said.removesuffix('; rerun to resume')})" if said.startswith("stopped during") else ""


def prefect_home(scratch: Path):
    """Prefect's temporary server keeps its database in the scratch folder, unless the user names a home."""
    import os

    if os.environ.get("PREFECT_HOME"):
        return environment()
    (scratch / "prefect").mkdir()
    return environment(PREFECT_HOME=str(scratch / "prefect"))
