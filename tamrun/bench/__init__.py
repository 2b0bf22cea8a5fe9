"""`python -m tamrun.bench`: tamrun and the peer (tam-ml 1.5.0) side by side, each run in a fresh process."""
