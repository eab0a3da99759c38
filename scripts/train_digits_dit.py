"""Train the shipped class-conditioned digits transformer on CPU.

    /work/venv/bin/python scripts/train_digits_dit.py --minutes 18 --threads 1

Epsilon-prediction MSE on the DDPM linear-beta VP schedule (1000 steps, uniform timesteps),
label dropout 10% (null label 10) for classifier-free guidance, AdamW with warm-up and cosine decay,
EMA of the weights (decay 0.999) which is what gets saved. The run stops at ``--steps`` or
``--minutes``, whichever comes first, and saves the EMA pipeline to
``dlm/image/checkpoints/digits_dit`` every ``--save-every`` seconds, each time printing the
requested-digit accuracy of 200 DDIM-20 samples (guidance 3) under the shipped CNN classifier.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dlm.image.digits_classifier import digits_split, load_digits_classifier
from dlm.image.digits_model import (CHECKPOINT, NULL_LABEL, DigitsLabelEmbedder, DigitsPipeline,
                                    build_transformer, default_scheduler)


def save(transformer, embedder, out: Path, meta: dict) -> DigitsPipeline:
    pipe = DigitsPipeline(transformer, embedder, default_scheduler())
    out.mkdir(parents=True, exist_ok=True)
    transformer.save_pretrained(out / "transformer", safe_serialization=True)
    embedder.save_pretrained(out / "label_embedder", safe_serialization=True)
    pipe.scheduler.save_pretrained(out / "scheduler")
    pipe.save_config(out)  # model_index.json, so DigitsPipeline.from_pretrained(out) works
    (out / "training.json").write_text(json.dumps(meta, indent=1) + "\n")
    pipe.set_progress_bar_config(disable=True)
    return pipe


@torch.no_grad()
def quick_eval(pipe: DigitsPipeline, classifier, n: int = 200) -> float:
    g = torch.Generator().manual_seed(1234)
    digits = torch.arange(n) % 10
    imgs = pipe(digits=digits, num_inference_steps=20, guidance_scale=3.0, generator=g).images
    return (classifier.predict(imgs) == digits).float().mean().item()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--minutes", type=float, default=18.0)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--label-dropout", type=float, default=0.1)
    p.add_argument("--save-every", type=float, default=180.0, help="seconds")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=CHECKPOINT)
    p.add_argument("--resume", action="store_true", help="continue from the (EMA) weights already in --out")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    split = digits_split()
    x_all, y_all = split.train_images, split.train_labels
    if args.resume:
        from diffusers import PixArtTransformer2DModel

        transformer = PixArtTransformer2DModel.from_pretrained(args.out / "transformer")
        embedder = DigitsLabelEmbedder.from_pretrained(args.out / "label_embedder")
        previous = json.loads((args.out / "training.json").read_text())
    else:
        transformer, embedder, previous = build_transformer(), DigitsLabelEmbedder(), None
    transformer.train()
    embedder.train()
    ema_t, ema_e = copy.deepcopy(transformer).eval(), copy.deepcopy(embedder).eval()
    params = list(transformer.parameters()) + list(embedder.parameters())
    print(f"params: {sum(q.numel() for q in params)}")
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    sched = default_scheduler()
    abar = sched.alphas_cumprod.float()
    classifier = load_digits_classifier("cnn")
    warmup = 100 if args.resume else 500

    t0, last_save, step = time.time(), time.time(), 0
    history = []
    deadline = t0 + 60 * args.minutes
    while step < args.steps and time.time() < deadline:
        # cosine decay against the time budget so a short run still anneals
        frac = max(step / args.steps, (time.time() - t0) / (deadline - t0))
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(0, x_all.shape[0], (args.batch_size,), generator=gen)
        x0, y = x_all[idx], y_all[idx].clone()
        y[torch.rand(args.batch_size, generator=gen) < args.label_dropout] = NULL_LABEL
        t = torch.randint(0, 1000, (args.batch_size,), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        a = abar[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        pred = transformer(xt, encoder_hidden_states=embedder(y), timestep=t,
                           added_cond_kwargs={"resolution": None, "aspect_ratio": None}).sample
        loss = F.mse_loss(pred, noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        with torch.no_grad():
            d = min(args.ema, (1 + step) / (10 + step))
            for m_ema, m in ((ema_t, transformer), (ema_e, embedder)):
                for pe, pm in zip(m_ema.parameters(), m.parameters()):
                    pe.lerp_(pm, 1 - d)
        if step % 200 == 0:
            print(f"step {step} loss {loss.item():.4f} lr {lr:.2e} ({time.time() - t0:.0f}s)", flush=True)
        if time.time() - last_save > args.save_every:
            pipe = save(ema_t, ema_e, args.out, {"step": step, "seconds": round(time.time() - t0)})
            acc = quick_eval(pipe, classifier)
            history.append({"step": step, "seconds": round(time.time() - t0), "ddim20_g3_accuracy": acc})
            print(f"saved at step {step}: DDIM-20 g=3 accuracy {acc:.3f}", flush=True)
            last_save = time.time()
    meta = {"step": step, "seconds": round(time.time() - t0), "batch_size": args.batch_size, "lr": args.lr,
            "ema": args.ema, "label_dropout": args.label_dropout, "threads": args.threads, "seed": args.seed,
            "final_loss": loss.item(), "history": history}
    if previous is not None:
        meta["resumed_from"] = previous
    pipe = save(ema_t, ema_e, args.out, meta)
    meta["ddim20_g3_accuracy"] = quick_eval(pipe, classifier)
    (args.out / "training.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
