"""One reward interface over every source: reward models (`rm_scorer`), a process reward model
(`prm_scorer`), a Python rule (`func_scorer`, its file checked before the run by `func_file`) and a remote
server (`remote`). `factory.build_scorer(cfg.reward, ...)` picks one; `score(prompts, responses, labels)`
returns a `base.RewardBatch`. The HTTP server (`server`, its limits and token in `serving`) is imported on its
own. Nothing is imported here: a process takes only the scorer it uses (a rule function's needs no
transformers)."""
