"""Data prep: reads, checks, splits, renders and tokenizes every dataset once (and builds the tiny preset's
model and task)."""
