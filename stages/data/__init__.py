"""Datasets as the stages read them: local files and their checks, values, chat templates, PRM rows,
tokenization, and the Arrow sets data prep writes once for every stage to read in place."""
