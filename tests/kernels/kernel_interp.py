"""Run a snippet in a fresh interpreter with TRITON_INTERPRET=1 set before Triton is imported.

A subprocess keeps the flag out of the main pytest process, where other folders import Triton
(through torch) without it.
"""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_interpreted(code: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout
