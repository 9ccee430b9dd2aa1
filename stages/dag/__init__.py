"""The pipeline DAG, declared once: each stage's spec, the artifacts passed between stages, the checks made
before a run. Imported by the driver: nothing here imports torch."""
