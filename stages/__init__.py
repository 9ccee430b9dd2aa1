"""What each pipeline stage computes. Knows nothing of Prefect or MLflow: a stage gets local
input paths and a `StageContext`, writes its outputs under `ctx.output_dir`, and returns them."""
