"""The tags a stage run carries in MLflow, which the store writes and the cache, the pins and the reports read."""

TAG_STAGE = "rlhf.stage"
TAG_FINGERPRINT = "rlhf.fingerprint"
TAG_STATUS = "rlhf.status"  # COMPLETE once every output is logged and registered: a cache entry from then on
TAG_OUTPUTS = "rlhf.outputs"
TAG_PARENT = "mlflow.parentRunId"
TAG_INPUT_PREFIX = "rlhf.input."
TAG_COMPUTE_SPAN = "rlhf.compute_span"  # "start end": Unix seconds of the stage function itself
COMPLETE = "complete"
# the pipeline run, the parent of a run's stage runs: what it was started with
TAG_KIND, KIND_PIPELINE = "rlhf.kind", "pipeline"
TAG_CONFIG = "rlhf.config"  # the preset or file
TAG_OVERRIDES = "rlhf.overrides"  # the overrides, joined by spaces
