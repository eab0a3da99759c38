import os
import sys

import torch

# Tests run on CPU with a fixed, small thread count: results must not depend on the machine.
torch.set_num_threads(min(2, os.cpu_count() or 1))
sys.path.insert(0, os.path.dirname(__file__))
