import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Every caching test runs single-threaded: these tiny models ran 20-50x slower with 2 intra-op
    threads on a loaded machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
