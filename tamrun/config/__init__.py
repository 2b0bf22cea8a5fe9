"""Config: typed schemas, ConfigStore registration, checks, effect specs and composition."""
