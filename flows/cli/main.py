"""The `rlhf` command line.

  rlhf run [--config PRESET|FILE] [--force STAGE ...] [--only STAGE ...] [KEY=VALUE ...]
  rlhf check [--config PRESET|FILE] [--force STAGE ...] [--only STAGE ...] [KEY=VALUE ...]
  rlhf serve [--config PRESET|FILE] [--prefect-port N] [--mlflow-port N | --no-ui]
  rlhf ui  [--config PRESET|FILE] [--port N]
  rlhf runs [--config PRESET|FILE] [--limit N]
  rlhf compare RUN [RUN ...] [--config PRESET|FILE]
  rlhf verify RUN [--stages STAGE,...] [--keep] [--config PRESET|FILE]
  rlhf serve-rm --model PATH [--host HOST] [--port N] [--batch-size N] [--max-request-mb MIB] [--max-queries N]
               [--max-query-chars N] [--max-waiting N]   (RLHF_REWARD_TOKEN: the bearer token it requires)
  rlhf vllm-env PATH
  rlhf merge --adapter PATH --out PATH [--base PATH] [--is-rm]
  rlhf cluster up|down|status [--dir PATH] [--pool NAME] [--worker-cpus N]
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from configs.errors import PipelineError
from configs.redaction import redacted
from stages.rewards.serving import Limits

if TYPE_CHECKING:
    from configs.schema import PipelineConfig


ENV_DEFAULTS = {  # each one the user may set otherwise
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "RAY_DEDUP_LOGS": "0",
    # Prefect waits 20 s for its temporary server; a busy 2-core machine can need longer
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    # a Ray call after the run's cluster was shut down (Ctrl-C) fails rather than starting a new cluster
    "RAY_ENABLE_AUTO_CONNECT": "0",
    # Ray's C++ failure handler answers a SIGTERM with a stack dump, and an abort 3 s later, which would cut
    # the run's orderly stop short (flows/run_end.py); its local cluster's processes inherit the setting
    "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "1",
}


def _prefect_home(state_dir: str) -> None:
    # Keep Prefect's own database beside the MLflow store unless the user points Prefect elsewhere.
    home = Path(state_dir).expanduser().resolve() / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(home))


def cmd_run(args: argparse.Namespace) -> int:
    from configs import load_config

    cfg = load_config(args.config, args.overrides)
    from flows import pre_run

    force, only = stage_names(args.force), stage_names(args.only)
    pre_run.check(cfg, force, only)
    from prefect.exceptions import ExternalSignal

    from artifacts import tracking
    from flows import run_end
    from flows.services import ray_cluster
    from flows.services.prefect_server import start_in_background

    named_cluster = ray_cluster.named_address(cfg.infra)
    if named_cluster:
        ray_cluster.use_local_token()  # Ray reads it when first imported, which is about to happen
    state_dir = Path(cfg.tracking.state_dir).expanduser().resolve()
    fresh = not state_dir.exists()
    fresh_store = new_store(cfg)
    _prefect_home(cfg.tracking.state_dir)
    with run_end.bounded_interrupt():
        prefect_server = start_in_background()
        finished = False
        try:
            if not only and not named_cluster and fresh_store:
                ray_cluster.start_early(cfg)
            try:
                from flows.pipeline import rlhf_pipeline

                run_end.hide_run_tracebacks()
                run_end.quiet_ray_thread_warning()
                if prefect_server is not None:
                    prefect_server.join()  # the flow uses it (or, had it failed, starts it again and reports why)
                with pre_run.checked(cfg, force, only):
                    rlhf_pipeline(config=args.config or "tiny", overrides=args.overrides, force=force, only=only or None)
            finally:
                ray_cluster.drop_early()
            finished = True
        except KeyboardInterrupt as exc:  # the flow's names the stage it stopped; one raised elsewhere, nothing
            raise KeyboardInterrupt(run_end.stop_message(exc)) from None
        except ExternalSignal as exc:  # a SIGTERM during the flow, which stopped its stages as for a Ctrl-C
            raise run_end.Terminated(run_end.stop_message(exc)) from None
        finally:
            if prefect_server is not None:  # a run that failed before the flow: let the start end, then stop it
                prefect_server.join(timeout=run_end.SERVER_START_S)
            run_end.end_prefect(temporary_server=prefect_server is not None)
            if fresh and not finished:
                run_end.remove_if_unused(state_dir, tracking.resolve_uri(cfg.tracking))
    return 0


def stage_names(values: list[str]) -> list[str]:
    """`--force` / `--only` values: repeated, or comma-separated."""
    return [s for item in values for s in item.split(",") if s]


def cmd_check(args: argparse.Namespace) -> int:
    from configs import load_config
    from flows import pre_run
    from stages.dag.plan import plan

    cfg = load_config(args.config, args.overrides)
    found = list(pre_run.problems(cfg, stage_names(args.force), stage_names(args.only)))
    for problem in found:
        print(f"error: {redacted(str(problem))}", file=sys.stderr)
    if found:
        return 2
    print(f"ok: {' '.join([args.config or 'tiny', *args.overrides])} passes every check `rlhf run` makes before its first stage")
    planned = plan(cfg, stage_names(args.only))
    width = max(len(name) for name in planned) + 2
    print("stages:")
    for name, step in planned.items():
        print(f"  {name.ljust(width)}{step.line()}")
    return 0


def new_store(cfg: PipelineConfig) -> bool:
    """A local MLflow store without its database yet: no stage can be cached, all of them will run."""
    from artifacts import tracking

    uri = tracking.resolve(cfg.tracking).uri
    return uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists()


def cmd_serve(args: argparse.Namespace) -> int:
    from configs import load_config
    from flows.cli.serve import serve

    _prefect_home(load_config(args.config).tracking.state_dir)
    serve(args.config, args.prefect_port, None if args.no_ui else args.mlflow_port)
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from artifacts import tracking
    from configs import load_config

    setup = tracking.resolve(load_config(args.config).tracking)
    print(f"MLflow UI on http://127.0.0.1:{args.port}/#/experiments?workflowType=machine_learning  "
          f"({redacted(setup.uri)})", flush=True)
    from flows.cli.serve import BACKEND_URI_ENV, mlflow_ui_command
    from flows.services.tied import tied_to

    # the UI ends with this command, however it ends (a SIGTERM or SIGKILL reaches only this process)
    return subprocess.call(mlflow_ui_command(args.port), env={**os.environ, BACKEND_URI_ENV: setup.uri},
                           preexec_fn=tied_to(os.getpid()))


def _store(config: str | None):
    from mlflow import MlflowClient

    from artifacts import run_owner, tracking
    from configs import load_config

    setup = tracking.resolve(load_config(config).tracking)
    client = MlflowClient(setup.uri)
    experiment = client.get_experiment_by_name(setup.experiment)
    if experiment is None:
        raise PipelineError(f"no pipeline runs yet in {setup.uri} (experiment {setup.experiment!r}); start one with `rlhf run`")
    run_owner.close_orphans(client, experiment.experiment_id)  # shown FAILED, not RUNNING forever
    return client, experiment.experiment_id


def cmd_runs(args: argparse.Namespace) -> int:
    from rich.console import Console

    from flows.cli.runs import pipeline_runs, runs_table

    client, experiment_id = _store(args.config)
    Console(width=160).print(runs_table(pipeline_runs(client, experiment_id, args.limit)))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from flows.cli.runs import comparison, comparison_table

    client, _ = _store(args.config)
    Console(width=160).print(comparison_table(comparison(client, args.runs), args.runs))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from flows.verify.command import verify

    return verify(args.run, stage_names(args.stages), args.keep, args.config)


def cmd_serve_rm(args: argparse.Namespace) -> int:
    from stages.rewards.server import serve

    limits = Limits(int(args.max_request_mb * 2**20), args.max_queries, args.max_query_chars, args.max_waiting)
    serve(args.model, host=args.host, port=args.port, batch_size=args.batch_size, limits=limits)
    return 0


def cmd_vllm_env(args: argparse.Namespace) -> int:
    from flows.cli.vllm_env import create

    create(Path(args.path))
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from stages.lora_merge.stage import merge

    out = Path(args.out)
    if out.exists():
        raise PipelineError(f"--out {out}: already exists; choose a new directory")
    diff = merge(Path(args.adapter), out, base=args.base, is_rm=True if args.is_rm else None)
    print(f"merged {args.adapter} into {args.base or 'its base'}: {out} (max |logit diff| vs the adapter model {diff:.2e})")
    return 0


def cmd_from_openrlhf(args: argparse.Namespace) -> int:
    from flows.cli.from_openrlhf import run

    print(run(args.script, args.output, args.set), file=sys.stderr)  # stdout holds the config itself
    return 0


def cmd_data_preview(args: argparse.Namespace) -> int:
    from rich.console import Console

    from configs import load_config
    from flows.cli.data_preview import preview

    preview(load_config(args.config, args.overrides), args.n, Console())
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    from flows.cli import cluster

    root = Path(args.dir).expanduser().resolve()
    if args.cluster_command == "up":
        started = time.monotonic()
        print(f"starting PostgreSQL, MLflow, Ray (head + worker node) and Prefect (server + worker) in {root} ...", flush=True)
        print(cluster.usage(cluster.up(root, args.pool, args.worker_cpus)))
        print(f"(up in {time.monotonic() - started:.0f} s)", flush=True)
        return 0
    if args.cluster_command == "down":
        stopped = cluster.down(root)
        print(f"stopped {', '.join(reversed(stopped.procs))}; their data stays in {root} for the next `rlhf cluster up`")
        return 0
    healthy, report = cluster.status(root)
    print(report)
    return 0 if healthy else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlhf", description="Cached, re-runnable LLM post-training pipeline.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the pipeline (stages whose fingerprint is unchanged are reused)")
    run.add_argument("--config", default=None, help="preset name in configs/ or a YAML path (default: tiny)")
    run.add_argument("--force", action="append", default=[], metavar="STAGE",
                     help="rerun this stage though nothing changed; its consumers rerun on the new output (repeatable, or comma-separated)")
    run.add_argument("--only", action="append", default=[], metavar="STAGE",
                     help="run just this stage, its inputs reused from MLflow (repeatable, or comma-separated)")
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides, e.g. sft.lr=3e-4 seed=7")
    run.set_defaults(func=cmd_run)
    check = sub.add_parser("check", help="make every check `rlhf run` makes before its first stage (config, stages, "
                                         "files, model, layout on the cluster), and nothing more")
    check.add_argument("--config", default=None, help="preset name in configs/ or a YAML path (default: tiny)")
    check.add_argument("--force", action="append", default=[], metavar="STAGE", help="as for `rlhf run`")
    check.add_argument("--only", action="append", default=[], metavar="STAGE", help="as for `rlhf run`")
    check.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides, as for `rlhf run`")
    check.set_defaults(func=cmd_check)
    serve = sub.add_parser("serve", help="serve the rlhf-pipeline/full and /stage deployments "
                                         "(starting a Prefect server and the MLflow UI if needed)")
    serve.add_argument("--config", default=None, help="the deployments' default preset or YAML, and the store to use")
    serve.add_argument("--prefect-port", type=int, default=4200, help="port of the Prefect server started here")
    serve.add_argument("--mlflow-port", type=int, default=5000, help="port of the MLflow UI")
    serve.add_argument("--no-ui", action="store_true", help="do not start the MLflow UI")
    serve.set_defaults(func=cmd_serve)
    ui = sub.add_parser("ui", help="open the MLflow UI on the pipeline's store")
    ui.add_argument("--config", default=None)
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(func=cmd_ui)
    runs = sub.add_parser("runs", help="list recent pipeline runs in the MLflow store")
    runs.add_argument("--config", default=None)
    runs.add_argument("--limit", type=int, default=10)
    runs.set_defaults(func=cmd_runs)
    compare = sub.add_parser("compare", help="stage metrics and eval results of pipeline runs side by side")
    compare.add_argument("runs", nargs="+", metavar="RUN", help="pipeline run ids (see `rlhf runs`)")
    compare.add_argument("--config", default=None)
    compare.set_defaults(func=cmd_compare)
    verify = sub.add_parser("verify", help="rerun a finished run's stages in a scratch store from the same config and "
                                           "inputs, and say per stage whether outputs and metrics came out identical")
    verify.add_argument("run", metavar="RUN", help="a pipeline run id (see `rlhf runs`) or a stage run id")
    verify.add_argument("--stages", action="append", default=[], metavar="STAGE",
                        help="verify only these stages of the run (repeatable, or comma-separated)")
    verify.add_argument("--keep", action="store_true", help="keep the scratch store and say where it is")
    verify.add_argument("--config", default=None, help="the preset or YAML whose store holds the run (default: tiny)")
    verify.set_defaults(func=cmd_verify)
    serve_rm = sub.add_parser("serve-rm", help="serve a reward model over HTTP (POST /get_reward, OpenRLHF protocol)")
    serve_rm.add_argument("--model", required=True, metavar="PATH", help="reward-model checkpoint directory")
    serve_rm.add_argument("--host", default="127.0.0.1")
    serve_rm.add_argument("--port", type=int, default=5001)
    serve_rm.add_argument("--batch-size", type=int, default=32)
    limits = Limits()
    serve_rm.add_argument("--max-request-mb", type=float, default=limits.max_request_bytes / 2**20, metavar="MIB",
                          help="largest request body in MiB (default %(default)g); a larger one is answered 413")
    serve_rm.add_argument("--max-queries", type=int, default=limits.max_queries, metavar="N",
                          help="most queries in one request (default %(default)s); more are answered 413")
    serve_rm.add_argument("--max-query-chars", type=int, default=limits.max_query_chars, metavar="N",
                          help="longest query in characters (default %(default)s); a longer one is answered 413")
    serve_rm.add_argument("--max-waiting", type=int, default=limits.max_waiting, metavar="N",
                          help="requests in line for the model (default %(default)s); the next is answered 503")
    serve_rm.set_defaults(func=cmd_serve_rm)
    vllm_env = sub.add_parser("vllm-env", help="make a Python environment with the CPU build of vLLM for the rollout engine (rl.rollout.engine=vllm)")
    vllm_env.add_argument("path", metavar="PATH", help="where to create it, e.g. .venv-vllm")
    vllm_env.set_defaults(func=cmd_vllm_env)
    merge = sub.add_parser("merge", help="merge a LoRA adapter into its base and save a full HF checkpoint")
    merge.add_argument("--adapter", required=True, metavar="PATH", help="adapter directory (adapter_config.json)")
    merge.add_argument("--out", required=True, metavar="PATH", help="where to write the merged checkpoint")
    merge.add_argument("--base", default=None, metavar="PATH", help="base checkpoint (default: the one the adapter records)")
    merge.add_argument("--is-rm", action="store_true", help="a reward model (sequence classification); default: from the adapter")
    merge.set_defaults(func=cmd_merge)
    from_openrlhf = sub.add_parser("from-openrlhf", help="an OpenRLHF launch script (train_sft, train_rm, train_prm, train_dpo, "
                                                        "train_kto, train_ppo_ray) as a commented config of this pipeline")
    from_openrlhf.add_argument("script", metavar="SCRIPT", help="the shell script, or - for a command line on standard input")
    from_openrlhf.add_argument("-o", "--output", default=None, metavar="PATH", help="write the config here (default: standard output)")
    from_openrlhf.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                               help="override a key of the result, as `rlhf run KEY=VALUE` does (repeatable)")
    from_openrlhf.set_defaults(func=cmd_from_openrlhf)
    data = sub.add_parser("data", help="look at the datasets before training").add_subparsers(dest="data_command", required=True)
    data_preview = data.add_parser("preview", help="rows as the model sees them (chat template, tokens with loss marked) and length percentiles")
    data_preview.add_argument("--config", default=None, help="preset name in configs/ or a YAML path (default: tiny)")
    data_preview.add_argument("--n", type=int, default=3, help="rows shown per dataset split")
    data_preview.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    data_preview.set_defaults(func=cmd_data_preview)
    clusters = sub.add_parser("cluster", help="PostgreSQL + MLflow server, a 2-node Ray cluster and a Prefect server + worker, on this machine")
    cluster_sub = clusters.add_subparsers(dest="cluster_command", required=True)
    for name, text in (("up", "start them, print their URLs and the commands that use them"),
                       ("down", "stop exactly what `up` started (the data stays)"), ("status", "what is up")):
        command = cluster_sub.add_parser(name, help=text)
        command.add_argument("--dir", default=".rlhf/cluster", help="the cluster's folder: each service's data and log, the state file")
        if name == "up":
            command.add_argument("--pool", default="rlhf", help="the Prefect work pool the worker serves")
            command.add_argument("--worker-cpus", type=int, default=os.cpu_count() or 1, metavar="N",
                                 help="CPUs the Ray worker node offers (default: this machine's)")
        command.set_defaults(func=cmd_cluster)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, `run`'s KEY=VALUE overrides accepted anywhere among its options: argparse takes
    the overrides up to the first option after them (`--only rm k=v --force sft k2=v2` left `k2=v2`)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command in ("run", "check") and not any(arg.startswith("-") for arg in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    args = parse_args(argv)
    from flows.run_end import Terminated

    try:
        return args.func(args)
    except PipelineError as exc:
        print(f"error: {redacted(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"interrupted: {exc}" if str(exc) else "interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"terminated: {exc}", file=sys.stderr)
        return 128 + signal.SIGTERM


def entry() -> None:
    """The `rlhf` program: `main`, then an exit that skips the garbage collector's last pass over every
    object torch, Ray, MLflow and Prefect made (seconds on a busy machine, which a Ctrl-C would wait for)."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
