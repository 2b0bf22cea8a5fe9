"""Every module of tamrun imports on its own, in a fresh interpreter: no module that a move or a rename
left behind with a broken import waits in a corner no fast test reaches (the quick tier,
tests/conftest.py, relies on this file for the modules only slow tests run)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import tamrun_modules

IMPORT_ALL = """
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as error:
        failed[name] = repr(error)
print(json.dumps(failed))
"""


def test_every_module_of_tamrun_imports_in_a_fresh_interpreter():
    names = tamrun_modules()
    assert "tamrun.runner" in names and "hydra_plugins.tamrun_ray_launcher" in names
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, *names], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {}
