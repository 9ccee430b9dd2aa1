"""The `rlhf` command line: one module per subcommand group; `main` parses and dispatches."""
