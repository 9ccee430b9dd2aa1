"""`rlhf verify RUN_ID`: a finished run's stages rerun one by one in a scratch store, from the same config and
the same input artifacts, their output files and metric histories compared with the original's."""
