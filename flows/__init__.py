"""Orchestration: the `rlhf-pipeline` Prefect flow and what runs one stage in it (cache key, MLflow run, Ray
launch, publishing), here; the `rlhf` command line in `cli/`; the servers and clusters a run starts beside it
in `services/`."""
