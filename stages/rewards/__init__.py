"""One reward interface over every source: reward models (`reward_model`), a process reward model
(`process_reward`), a Python rule (`function`) and a remote server (`remote`).
`factory.build_scorer(cfg.reward, ...)` picks one; `score(prompts, responses, labels)` returns a
`base.RewardBatch`. The HTTP server (`server`) is imported on its own. Nothing is imported here: a
process takes only the scorer it uses (a rule function's needs no transformers)."""
