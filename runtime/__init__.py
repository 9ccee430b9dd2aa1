"""Where stage work runs: Ray. The local cluster and the pool of stage workers (`worker_pool`), the RL stage's
actors behind the driver's `Backend` (`rl_actors`, `rl_placement`, `rollout_engines`, `vllm_engine`), and the
gate that stops Ray calls once a run is stopping (`ray_shutdown`). `stages/` computes; this package places."""
