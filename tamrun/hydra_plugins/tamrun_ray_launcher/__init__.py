"""tamrun's Ray launcher, a Hydra plugin (Hydra loads launchers only from ``hydra_plugins``)."""
