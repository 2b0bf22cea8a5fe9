"""The MLflow store: opening it from many processes, its waits, a locked server's refusals, the URI from the environment."""
