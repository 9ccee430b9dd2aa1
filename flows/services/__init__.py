"""The processes a run or a served deployment needs beside it (Prefect's server and database, Ray),
started in sessions of their own and found and stopped again."""
