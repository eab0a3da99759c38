"""Train the joint sampler's layer (ADJUST) for a model: the same as `dlm train-joint ...`.

    python scripts/train_joint.py --model oracle-permutation
    python scripts/train_joint.py --model tiny-dlm --steps 300
"""
import sys

from dlm.cli import main

if __name__ == "__main__":
    sys.exit(main(["train-joint", *sys.argv[1:]]))
