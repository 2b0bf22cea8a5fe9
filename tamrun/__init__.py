"""tamrun: a declarative, config-driven experiment runner for time-series additive models.

Importing the package does no work and prints nothing; `python -m tamrun` is the entry point and
`tamrun.runner.run(cfg)` the library one.
"""

__version__ = "0.1.0"
