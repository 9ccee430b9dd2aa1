"""MLflow side of the pipeline: tracking setup, fingerprints, the cache look-up, publishing and
downloading stage artifacts, and the metric sink handed to stages."""
