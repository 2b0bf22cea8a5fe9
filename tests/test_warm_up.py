"""The GPU libraries warmed while the data loads (tamrun/device/manager.py: `warm_libraries`, `libraries_warming`)."""

from __future__ import annotations

import threading

import pytest
import torch

from tamrun.device.manager import libraries_warming, warm_libraries

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_warm_up_makes_the_fits_calls_without_drawing_a_random_number(device, dtype):
    """Every call is valid in each dtype (on the host here, on the GPU where there is one), and the run's
    random streams are where they were: the warm-up draws nothing."""
    cpu_state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state() if device == "cuda" else None
    warm_libraries(torch.device(device), dtype)
    assert torch.equal(torch.get_rng_state(), cpu_state)
    if cuda_state is not None:
        assert torch.equal(torch.cuda.get_rng_state(), cuda_state)


def test_the_warming_thread_has_ended_when_the_block_ends():
    with libraries_warming(torch.device("cpu"), torch.float64):
        running = [t for t in threading.enumerate() if t.name == "tamrun-gpu-warm-up"]
    assert len(running) <= 1
    assert not [t for t in threading.enumerate() if t.name == "tamrun-gpu-warm-up"]
