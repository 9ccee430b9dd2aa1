"""Periodic progress lines for long loops: step, the latest metrics, rate and ETA."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping


class Progress:
    """Prints `[stage] step 120/600 (20%) loss=1.234 | 9.8 it/s, eta 49s` at most every `every_s` seconds."""

    def __init__(self, stage: str, total: int, start: int = 0, every_s: float = 5.0, enabled: bool = True):
        self.stage, self.total, self.start, self.every_s, self.enabled = stage, total, start, every_s, enabled
        self._t0 = self._last = time.monotonic()

    def update(self, step: int, force: bool = False, **metrics: float) -> None:
        self.show(step, metrics, force)

    def show(self, step: int, metrics: Mapping[str, float], force: bool = False) -> None:
        """`update` for metrics named at run time (a name such as `force` or `step` stays a metric)."""
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < self.every_s and step < self.total):
            return
        self._last = now
        done = step - self.start
        rate = done / max(now - self._t0, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else float("inf")
        shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
        pct = 100 * step / max(self.total, 1)
        print(
            f"[{self.stage}] step {step}/{self.total} ({pct:.0f}%) {shown} | {rate:.2f} it/s, eta {eta:.0f}s",
            file=sys.stdout,
            flush=True,
        )
