"""Orchestration only: the `rlhf-pipeline` Prefect flow, the stage task wrapper (cache key,
MLflow run, Ray launch), the Ray session and the `rlhf` CLI."""
