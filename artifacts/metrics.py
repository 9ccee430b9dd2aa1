"""The `log_metrics(dict, step)` callback stages receive: picklable, so it travels to Ray workers,
and it writes to the stage's MLflow run (called from rank 0 only)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow import MlflowClient


class MlflowMetrics:
    def __init__(self, tracking_uri: str, run_id: str):
        self.tracking_uri, self.run_id = tracking_uri, run_id
        self._client: MlflowClient | None = None  # made on first use: the callback is pickled without it

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Metric

        if self._client is None:
            from artifacts.tracking import quiet_store_errors

            quiet_store_errors()
            self._client = MlflowClient(self.tracking_uri)
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if not math.isnan(float(v))]
        if batch:
            self._client.log_batch(self.run_id, metrics=batch)

    def __getstate__(self):
        return {"tracking_uri": self.tracking_uri, "run_id": self.run_id, "_client": None}
