"""Config: typed schemas, ConfigStore registration, checks, effect specs and composition; sizes (`units`) and
derived-column expressions (`expr`) as a setting writes them."""
