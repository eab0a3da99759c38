"""Train tiny-dgemma: transformers' DiffusionGemma architecture, small, on the task suites (CPU).

The model is `transformers.DiffusionGemmaForBlockDiffusion` with `dlm.tiny.dgemma.tiny_dgemma_config`
(about 1M parameters) and the tiny-dlm tokenizer. transformers ships no training loss for it; this is
ours, a uniform-noise ("uniform transition") discrete diffusion loss in the block order that
`generate` decodes in:

  sequence   [prompt + "\\n"] [canvas 0] [canvas 1] ... [canvas K-1]      (canvas = C tokens)
             the answer, then EOS up to the end of its last canvas (at least one EOS);
  encoder    one causal pass over the clean sequence. Because the encoder is causal, its keys and
             values for the prompt plus canvases 0..k-1 are exactly the cache `generate` holds when it
             starts canvas k, so one pass serves every canvas;
  noise      each canvas gets a rate r ~ U(0, 1); each of its tokens is replaced, with probability r,
             by a token drawn uniformly from the whole vocabulary (the prior `generate` starts from and
             re-noises rejected tokens to) [D3PM uniform transitions: Austin et al. 2021, "Structured
             Denoising Diffusion Models in Discrete State-Spaces"; UDLM: Schiff et al. 2024, "Simple
             Guidance Mechanisms for Discrete Diffusion Models"; Duo: Sahoo et al. 2025, "The Diffusion
             Duality"];
  decoder    all K noisy canvases in one pass (B, K*C): canvas k attends to the encoder cache up to
             the start of canvas k and bidirectionally to itself only (a 4-D mask), at the positions
             `generate` gives it (the prompt's length + k*C onwards);
  loss       cross-entropy against the clean canvas at every canvas position (noised or not), mean
             over the canvases that `generate` would decode (those up to the first EOS's canvas);
  self-cond. for half the sequences (`--self-cond`), a first decoder pass without self-conditioning
             gives logits; they are detached, divided by a temperature T ~ U(--sc-temp) (generate feeds
             back `raw_logits / T_step` from its linear temperature schedule, in the embeddings' dtype)
             and fed to the second pass as `self_conditioning_logits`; the other half get
             `self_conditioning_mask=False` (a zero signal, as generate's first step)
             [self-conditioning: Chen et al. 2022, "Analog Bits"].

The prompt's left padding (a batch of prompts of different lengths) is handled as `generate` does
with an attention mask: pad keys are masked out and positions count the pads (rotary attention only
sees position differences, so a shift changes nothing).

Resumable: `--out DIR` holds `state.pt` (weights, optimizer, step, minutes trained) and the checkpoint
folder `DIR/checkpoint` (what ships: config.json, model.safetensors in bfloat16, tokenizer.json,
generation_config.json); `--resume` continues the run, its learning-rate schedule (warm-up, cosine
over `--max-minutes` of training time) included. Training examples are fresh train-split examples
generated on the fly, excluding the validation subset (`dlm.tiny.dgemma.is_validation`).

    OMP_NUM_THREADS=1 python scripts/train_tiny_dgemma.py --out runs/tiny_dgemma --max-minutes 100 --threads 1
    ... --resume    # after an interruption
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlm.tasks import get_suite, split_of  # noqa: E402
from dlm.tasks.arithmetic import ArithmeticDrill, pad_numbers  # noqa: E402
from dlm.tiny.dgemma import EOS_ID, PAD_ID, is_validation, tiny_dgemma_config  # noqa: E402
from dlm.tiny.tokenizer import TinyCharTokenizer  # noqa: E402

TOKENIZER_SOURCE = Path(__file__).resolve().parents[1] / "dlm" / "tiny" / "checkpoints" / "tiny-dlm"

TASK_WEIGHTS = {
    "copy": 1.0, "reverse": 1.5, "sort": 2.0, "insert_index": 1.5, "remove_index": 1.5,
    "replace_index": 1.5, "shuffle": 2.0, "insert_random": 2.0, "replace_random": 2.0,
    "arithmetic": 5.0, "arithmetic_drill": 3.0, "sudoku": 2.5, "latin": 2.5,
}

DEFAULT_GENERATION = dict(max_new_tokens=48, max_denoising_steps=16, t_min=0.4, t_max=0.8,
                          entropy_bound=0.1, stability_threshold=1, confidence_threshold=0.005)


# ----------------------------------------------------------------------------------------- data
def task_weights(overrides: str) -> dict[str, float]:
    """TASK_WEIGHTS with 'name=weight,...' overrides applied."""
    weights = dict(TASK_WEIGHTS)
    for item in filter(None, (part.strip() for part in overrides.split(","))):
        name, _, value = item.partition("=")
        if name not in weights or not value:
            raise ValueError(f"--task-weights: bad entry {item!r}; use name=weight, name in {sorted(weights)}")
        weights[name] = float(value)
    return weights


def training_tasks() -> dict:
    tasks = {t.name: t for t in get_suite("all")}
    tasks["arithmetic_drill"] = ArithmeticDrill()
    return tasks


def sample_example(task, rng: random.Random, padded: bool):
    """A fresh training example: train split, not in the validation subset; (prompt, answer)."""
    while True:
        ex = task._make(rng)
        if split_of(ex.prompt) == "train" and not is_validation(ex.prompt):
            answer = pad_numbers(ex.answer) if padded and task.name.startswith("arithmetic") else ex.answer
            return ex.prompt, answer


def canvas_ids(tok, answer: str, canvas_length: int) -> list[int]:
    """Answer ids then EOS up to a whole number of canvases, at least one EOS (generate stops on it)."""
    ids = tok.encode(answer)
    k = math.ceil((len(ids) + 1) / canvas_length)
    return ids + [EOS_ID] * (k * canvas_length - len(ids))


def make_batch(pairs, tok, canvas_length: int) -> dict:
    """Left-padded prompts followed by the clean canvases.

    Returns input_ids (B, P + K*C) clean, attention (B, P + K*C) bool (False on prompt padding),
    prompt_len P, canvases K, canvas_valid (B, K) (False on canvases after a sequence's last one,
    which are EOS filler that generate never decodes).
    """
    prompts = [tok.encode_prompt(p) for p, _ in pairs]
    answers = [canvas_ids(tok, a, canvas_length) for _, a in pairs]
    P = max(len(p) for p in prompts)
    K = max(len(a) for a in answers) // canvas_length
    rows, att, valid = [], [], []
    for p, a in zip(prompts, answers):
        k = len(a) // canvas_length
        rows.append([PAD_ID] * (P - len(p)) + p + a + [EOS_ID] * ((K - k) * canvas_length))
        att.append([False] * (P - len(p)) + [True] * (len(p) + K * canvas_length))
        valid.append([True] * k + [False] * (K - k))
    return {"input_ids": torch.tensor(rows), "attention": torch.tensor(att), "prompt_len": P,
            "canvases": K, "canvas_valid": torch.tensor(valid)}


def uniform_corrupt(clean: torch.Tensor, vocab_size: int, gen: torch.Generator,
                    min_rate: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace each token of each canvas by a uniform random token at a per-canvas rate.

    clean (B, K, C) -> noisy (B, K, C), rates (B, K) with rate ~ U(min_rate, 1). The random token is
    drawn from all `vocab_size` ids (it may equal the clean one), as generate's canvas prior.
    """
    B, K, C = clean.shape
    rates = min_rate + (1 - min_rate) * torch.rand(B, K, generator=gen)
    hit = torch.rand(B, K, C, generator=gen) < rates[..., None]
    noise = torch.randint(0, vocab_size, (B, K, C), generator=gen)
    return torch.where(hit, noise, clean), rates


# ---------------------------------------------------------------------------------------- masks
def encoder_mask(attention: torch.Tensor) -> torch.Tensor:
    """Causal mask over the whole clean sequence, pad keys removed. attention (B, L) -> (B, 1, L, L) bool.

    A pad query keeps its own key so that no softmax row is empty (its output is never read)."""
    L, dev = attention.shape[1], attention.device
    causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
    m = causal[None] & attention[:, None, :]
    m = m | torch.eye(L, dtype=torch.bool, device=dev)[None]
    return m[:, None]


def decoder_mask(attention: torch.Tensor, prompt_len: int, canvases: int, canvas_length: int) -> torch.Tensor:
    """Canvas k's queries see the encoder keys before canvas k (not pads) and canvas k's own keys.

    attention (B, L) with L = prompt_len + canvases * C -> (B, 1, K*C, L + K*C) bool; the key axis is
    [encoder cache (L), decoder canvases (K*C)], the order the decoder's attention concatenates them."""
    C, K = canvas_length, canvases
    L, dev = attention.shape[1], attention.device
    canvas_of_query = torch.arange(K * C, device=dev) // C                       # (KC,)
    enc_visible = torch.arange(L, device=dev)[None, :] < (prompt_len + canvas_of_query * C)[:, None]   # (KC, L)
    enc = enc_visible[None] & attention[:, None, :]                              # (B, KC, L)
    dec = canvas_of_query[:, None] == canvas_of_query[None, :]                   # (KC, KC)
    dec = dec[None].expand(attention.shape[0], -1, -1)
    return torch.cat([enc, dec], dim=-1)[:, None]


# ----------------------------------------------------------------------------------------- loss
def encode_clean(model, batch: dict):
    """One causal encoder pass over the clean batch; returns the cache (keys/values per layer)."""
    from transformers import DynamicCache

    ids = batch["input_ids"]
    m = encoder_mask(batch["attention"])
    cache = DynamicCache(config=model.config.get_text_config())
    out = model.model.encoder(input_ids=ids, attention_mask={"full_attention": m, "sliding_attention": m},
                              position_ids=torch.arange(ids.shape[1], device=ids.device)[None], cache=cache)
    return out.cache


def decode_canvases(model, cache, batch: dict, noisy: torch.Tensor, sc_logits=None, sc_mask=None):
    """Decoder logits for all noisy canvases at once: noisy (B, K*C) -> (B, K*C, V) float32."""
    P, K = batch["prompt_len"], batch["canvases"]
    C = model.config.canvas_length
    m = decoder_mask(batch["attention"], P, K, C)
    out = model(cache=cache, decoder_input_ids=noisy, self_conditioning_logits=sc_logits,
                self_conditioning_mask=sc_mask, decoder_attention_mask={"full_attention": m, "sliding_attention": m},
                decoder_position_ids=(P + torch.arange(K * C, device=noisy.device))[None])
    return out.logits


def dgemma_loss(model, batch: dict, gen: torch.Generator, self_cond: float = 0.5,
                sc_temp: tuple[float, float] = (0.4, 0.8), min_rate: float = 0.0) -> tuple[torch.Tensor, dict]:
    """The uniform-noise block-diffusion loss (module docstring). Returns (loss, stats)."""
    V = model.config.text_config.vocab_size
    C = model.config.canvas_length
    P, K = batch["prompt_len"], batch["canvases"]
    B = batch["input_ids"].shape[0]
    clean = batch["input_ids"][:, P:].view(B, K, C)
    # the noise is drawn on the CPU generator (same draws on any device), then moved
    noisy, rates = uniform_corrupt(clean.cpu(), V, gen, min_rate)
    noisy = noisy.view(B, K * C).to(clean.device)
    cache = encode_clean(model, batch)
    sc_mask = (torch.rand(B, generator=gen) < self_cond).to(clean.device)
    sc_logits = None
    if sc_mask.any():
        with torch.no_grad():
            first = decode_canvases(model, cache, batch, noisy)
        temp = (sc_temp[0] + (sc_temp[1] - sc_temp[0]) * torch.rand(B, generator=gen)).to(clean.device)
        emb_dtype = model.model.decoder.embed_tokens.weight.dtype
        sc_logits = (first / temp[:, None, None]).to(emb_dtype).detach()
    logits = decode_canvases(model, cache, batch, noisy, sc_logits, sc_mask if sc_logits is not None else None)
    ce = F.cross_entropy(logits.reshape(-1, V), clean.reshape(-1), reduction="none").view(B, K, C)
    w = batch["canvas_valid"].to(ce.dtype)[..., None].expand_as(ce)
    loss = (ce * w).sum() / w.sum()
    with torch.no_grad():
        acc = ((logits.argmax(-1).view(B, K, C) == clean).to(ce.dtype) * w).sum() / w.sum()
    return loss, {"acc": acc.item(), "tokens": w.sum().item(), "sc_share": sc_mask.float().mean().item(),
                  "mean_rate": rates.mean().item()}


def grouped_batches(pairs, tok, canvas_length: int) -> list[dict]:
    """One batch per answer length in canvases: a list-edit row (one canvas) is not padded out to an
    arithmetic row's three, which would triple its cost. Same examples, same loss terms."""
    groups: dict[int, list] = {}
    for prompt, answer in pairs:
        groups.setdefault(len(canvas_ids(tok, answer, canvas_length)), []).append((prompt, answer))
    return [make_batch(g, tok, canvas_length) for _, g in sorted(groups.items())]


def batch_to(batch: dict, device: torch.device) -> dict:
    """The batch's tensors on `device` (ints stay as they are)."""
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


# ------------------------------------------------------------------------------------ checkpoint
def save_checkpoint(model, tok, folder: Path, generation: dict, info: dict) -> None:
    """config.json, model.safetensors (bfloat16 on disk; config says float32 so loaders upcast),
    tokenizer.json, generation_config.json, training_info.json; written to a temp folder and renamed."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from dlm.tiny.dgemma import generation_config

    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    half = DiffusionGemmaForBlockDiffusion(model.config)
    half.load_state_dict(model.state_dict())
    half.generation_config = generation_config(**generation)
    half.to(torch.bfloat16).save_pretrained(tmp)
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok.save_pretrained(tmp)
    (tmp / "training_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)


def lr_at(minutes: float, step: int, args) -> float:
    warm = min(1.0, (step + 1) / max(1, args.warmup))
    progress = min(1.0, minutes / args.max_minutes)
    cos = args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return args.lr * warm * cos


def quick_eval(model, tok, n_per_task: int, seed: int = 7) -> dict:
    """Accuracy per suite on validation prompts with transformers' generate (default config)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from eval_tiny_dgemma import evaluate_prompts, validation_examples

    model.eval()
    res = evaluate_prompts(model, tok, validation_examples(n_per_task, seed), generation=DEFAULT_GENERATION)
    model.train()
    return res["suites"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/tiny_dgemma")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out from its state.pt")
    ap.add_argument("--init", default=None,
                    help="start from this checkpoint folder's weights (e.g. the shipped tiny-dgemma) with a "
                         "fresh optimizer and schedule; its config sets the model's size")
    ap.add_argument("--device", default="cpu", help="torch device for training (batches are built on CPU)")
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--canvas-length", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=48)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--max-minutes", type=float, default=100.0, help="training time the cosine spans")
    ap.add_argument("--stop-minutes", type=float, default=None,
                    help="stop this process after this many minutes of training in all (default --max-minutes)")
    ap.add_argument("--self-cond", type=float, default=0.5, help="share of sequences with self-conditioning")
    ap.add_argument("--sc-temp", default="0.4,0.8", help="range of the temperature dividing self-cond. logits")
    ap.add_argument("--min-rate", type=float, default=0.0)
    ap.add_argument("--arithmetic-format", choices=("plain", "padded"), default="padded")
    ap.add_argument("--task-weights", default="")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--save-every-min", type=float, default=5.0)
    ap.add_argument("--eval-n", type=int, default=4, help="validation prompts per task at each save (0: none)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    from transformers import DiffusionGemmaForBlockDiffusion

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = TinyCharTokenizer.from_pretrained(TOKENIZER_SOURCE)
    sc_temp = tuple(float(x) for x in args.sc_temp.split(","))
    state_path = out / "state.pt"
    if args.resume and args.init:
        ap.error("--resume and --init: give one (--resume continues --out's run, --init starts a new one)")
    if args.resume:
        if not state_path.is_file():
            raise SystemExit(f"--resume: no {state_path}")
        state = torch.load(state_path, weights_only=False)
        saved = state["args"]
        for key in ("hidden_size", "layers", "intermediate", "experts", "canvas_length"):
            setattr(args, key, saved[key])
    torch.manual_seed(args.seed)
    if args.init:  # the folder's config and weights (its every size, not only those recorded in args)
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(args.init, dtype=torch.float32)
        text = model.config.text_config  # recorded in args, so training_info and a --resume see them
        args.hidden_size, args.layers = text.hidden_size, text.num_hidden_layers
        args.intermediate, args.experts = text.intermediate_size, text.num_experts
        args.canvas_length = model.config.canvas_length
        print(f"weights from {args.init}", flush=True)
    else:
        model = DiffusionGemmaForBlockDiffusion(tiny_dgemma_config(
            tok.vocab_size, hidden_size=args.hidden_size, layers=args.layers, intermediate_size=args.intermediate,
            num_experts=args.experts, canvas_length=args.canvas_length))
    device = torch.device(args.device)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.98))
    step, minutes = 0, 0.0
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    if args.resume:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])  # its moments follow the (already moved) parameters' device
        step, minutes = state["step"], state["minutes"]
        rng.setstate(state["rng"])
        gen.set_state(state["gen"])
        print(f"resumed at step {step}, {minutes:.1f} min", flush=True)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params:,} vocab {tok.vocab_size} canvas {args.canvas_length}", flush=True)

    tasks = training_tasks()
    weights = task_weights(args.task_weights)
    names = [n for n in weights if weights[n] > 0]
    probs = [weights[n] for n in names]
    stop_at = args.stop_minutes if args.stop_minutes is not None else args.max_minutes
    ema, t_last_save = None, time.time()
    t_prev = time.time()

    def save_all(final=False):
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "minutes": minutes,
                    "rng": rng.getstate(), "gen": gen.get_state(), "args": vars(args)}, out / "state.tmp")
        (out / "state.tmp").replace(state_path)
        info = {"step": step, "minutes": round(minutes, 2), "ema_loss": ema, "params": n_params,
                "command_args": vars(args)}
        if args.eval_n:
            info["validation"] = quick_eval(model, tok, args.eval_n)
        save_checkpoint(model, tok, out / "checkpoint", DEFAULT_GENERATION, info)
        print(f"saved step {step} min {minutes:.1f} {info.get('validation', '')}", flush=True)

    while minutes < stop_at:
        for g in opt.param_groups:
            g["lr"] = lr_at(minutes, step, args)
        pairs = [sample_example(tasks[rng.choices(names, probs)[0]], rng, args.arithmetic_format == "padded")
                 for _ in range(args.batch_size)]
        opt.zero_grad(set_to_none=True)
        # the token mean over the whole batch, accumulated over groups of equal canvas count
        parts = [dgemma_loss(model, batch_to(b, device), gen, args.self_cond, sc_temp, args.min_rate)
                 for b in grouped_batches(pairs, tok, args.canvas_length)]
        total = sum(st["tokens"] for _, st in parts)
        loss = sum(l * (st["tokens"] / total) for l, st in parts)
        stats = {"acc": sum(st["acc"] * st["tokens"] for _, st in parts) / total}
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        now = time.time()
        minutes += (now - t_prev) / 60
        t_prev = now
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % args.log_every == 0:
            print(f"step {step} min {minutes:.1f} loss {loss.item():.3f} ema {ema:.3f} acc {stats['acc']:.3f} "
                  f"lr {opt.param_groups[0]['lr']:.2e}", flush=True)
        if now - t_last_save > args.save_every_min * 60:
            save_all()
            t_last_save = time.time()
            t_prev = time.time()   # evaluation time is not training time
    save_all(final=True)


if __name__ == "__main__":
    main()
