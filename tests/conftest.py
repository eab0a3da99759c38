import os
import sys

import pytest
import torch

# Tests run on CPU with a fixed, small thread count: results must not depend on the machine.
torch.set_num_threads(min(2, os.cpu_count() or 1))
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def one_thread():
    """One intra-op thread for the test, restored afterwards. Tests of hundreds of small calls on tiny
    models ask for it: on a shared 2-core machine a second thread mostly spin-waits, and such tests ran
    several to 50 times slower with it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
