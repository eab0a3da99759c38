"""Train the shipped digits classifiers (CNN verifier + held-out MLP) on the fixed sklearn split.

    /work/venv/bin/python scripts/train_digits_classifier.py --arch cnn --seed 0
    /work/venv/bin/python scripts/train_digits_classifier.py --arch mlp --seed 1

Augmentation: random 1-pixel shifts and small Gaussian pixel noise, so that the classifier does not
fall apart on slightly imperfect generated digits. Writes
``dlm/image/checkpoints/digits_classifier_<arch>.safetensors`` with test accuracy in its metadata.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from dlm.image.digits_classifier import ARCHITECTURES, checkpoint_path, digits_split


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    n = x.shape[0]
    padded = F.pad(x, (1, 1, 1, 1), value=-1.0)
    dx = torch.randint(0, 3, (n,), generator=gen)
    dy = torch.randint(0, 3, (n,), generator=gen)
    out = torch.stack([padded[i, :, dy[i]:dy[i] + 8, dx[i]:dx[i] + 8] for i in range(n)])
    keep = torch.rand(n, 1, 1, 1, generator=gen) < 0.5  # half the batch unshifted
    out = torch.where(keep, x, out)
    return (out + 0.1 * torch.randn(out.shape, generator=gen)).clamp(-1.2, 1.2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", choices=sorted(ARCHITECTURES), default="cnn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    split = digits_split()
    net = ARCHITECTURES[args.arch]()
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    steps = args.epochs * ((len(split.train_labels) + args.batch_size - 1) // args.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps)
    t0 = time.time()
    for epoch in range(args.epochs):
        net.train()
        perm = torch.randperm(len(split.train_labels), generator=gen)
        for i in range(0, len(perm), args.batch_size):
            b = perm[i:i + args.batch_size]
            loss = F.cross_entropy(net(augment(split.train_images[b], gen)), split.train_labels[b],
                                   label_smoothing=0.05)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        if (epoch + 1) % 10 == 0:
            net.eval()
            with torch.no_grad():
                acc = (net(split.test_images).argmax(-1) == split.test_labels).float().mean().item()
            print(f"epoch {epoch + 1}: loss {loss.item():.3f} test acc {acc:.4f} ({time.time() - t0:.0f}s)")
    net.eval()
    with torch.no_grad():
        acc = (net(split.test_images).argmax(-1) == split.test_labels).float().mean().item()
    meta = {"arch": args.arch, "seed": args.seed, "epochs": args.epochs, "test_accuracy": round(acc, 4),
            "n_train": len(split.train_labels), "n_test": len(split.test_labels)}
    path = checkpoint_path(args.arch)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path),
              metadata={k: json.dumps(v) for k, v in meta.items()})
    print(json.dumps({"path": str(path), **meta}))


if __name__ == "__main__":
    main()
