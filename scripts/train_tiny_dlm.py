"""Train the built-in tiny masked-diffusion LM on the task suites (masked-diffusion SFT).

Sequence: prompt + "\\n" + answer + <eos> padding the response to R = 64 tokens (names and words
are single tokens, see `learn_word_vocabulary`; rotary positions restart after the separator, see
`TinyDLMModel.dlm_position_ids`). Only response tokens are masked:
  - random pattern: t ~ U(--min-mask-ratio, 1), each response position masked with probability t;
  - semi-autoregressive pattern (a fraction `--semi-ar`): block size b in `--semi-ar-blocks` (default 8, 16, 32), a clean
    prefix of k*b response tokens, random masking (prob t) inside the next block, everything after
    it fully masked, as blockwise left-to-right decoding sees it.
Loss: cross-entropy on masked positions, averaged over them (`--loss-weighting mean`, default), or
LLaDA's 1/t weighting normalised by R (`inverse-t`).

Why not LLaDA's recipe as is: at this size and CPU budget, t ~ U(0, 1) with 1/t weighting never
learned to copy from the prompt (0% on every task after 3,400 steps; on a toy copy task 14% after
300 steps), while t ~ U(0.5, 1) with a plain mean reached 100% on the toy task by step 200. Fresh
training-split examples are generated on the fly; validation prompts (`dlm.tasks.is_validation`) are
left out, and the periodic evaluation (`--eval-n`) reads the validation split, so that a checkpoint is
chosen on validation prompts and reported on test prompts (`scripts/eval_tiny_dlm.py --split val|test`).
The shipped checkpoint was trained before this split existed: its training saw validation prompts.

The shipped checkpoint (dlm/tiny/checkpoints/tiny-dlm, "v2.6", 1.29M parameters, 6 layers, the
prompt cut off from the response) is stage 25d of a sequence of CPU runs (884 minutes on one thread
in all), each started from the one before with `--init`. Every stage's command, its readings and the
experiments that were not shipped are in docs/tiny_dlm_training.md. The last step (stage 25d, from
stage 24d's end, 55 min):

    python scripts/train_tiny_dlm.py --init <stage 24d> --out /tmp/stage25d --max-minutes 55 \
        --threads 1 --lr 2e-4 --warmup 30 --min-mask-ratio 0 --loss-weighting row-mean --arithmetic-format padded \
        --arith-drill 4 --result-mask 0.4 --semi-ar 0.5 --semi-ar-blocks 1,2,4,8,16,32 --order-rollout 1.0 \
        --soft-random-targets --prompt-causal --cut-trailing 0.3 \
        --task-weights reverse=1,sort=3,insert_index=1,remove_index=0.7,replace_index=1,shuffle=8,insert_random=6,replace_random=6,arithmetic=2,sudoku=0.7,latin=0.7 \
        --seed 50 --save-every-min 10 --eval-every-min 1000
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlm.generation import generate  # noqa: E402
from dlm.tasks import CHAIN_GEN_LENGTH, PROMPT_SUFFIX, SUITES, get_suite, subset_of  # noqa: E402
from dlm.tasks.arithmetic import ArithmeticDrill, pad_numbers  # noqa: E402
from dlm.tiny import TinyCharTokenizer, TinyDLMConfig, TinyDLMModel  # noqa: E402

RESPONSE_LEN = 64

# Harder tasks get more samples.
TASK_WEIGHTS = {
    "copy": 1.0, "reverse": 1.0, "sort": 1.5, "insert_index": 1.0, "remove_index": 1.0,
    "replace_index": 1.0, "shuffle": 0.7, "insert_random": 0.7, "replace_random": 0.7,
    "arithmetic": 2.0, "sudoku": 1.5, "latin": 1.5,
}


def parse_weights(overrides: str, defaults: dict[str, float], option: str) -> dict[str, float]:
    """`defaults` with 'name=weight,...' overrides applied; ValueError names `option` and the valid names."""
    weights = dict(defaults)
    for item in filter(None, (part.strip() for part in overrides.split(","))):
        name, _, value = item.partition("=")
        if name not in defaults or not value:
            raise ValueError(f"{option}: bad entry {item!r}; use name=weight with a name from {sorted(defaults)}")
        weights[name] = float(value)
    return weights


def task_weights(overrides: str) -> dict[str, float]:
    """TASK_WEIGHTS with 'name=weight,...' overrides applied."""
    return parse_weights(overrides, TASK_WEIGHTS, "--task-weights")


def chain_weights(overrides: str) -> dict[str, float]:
    """Sampling weights of the chains tasks ('name=weight,...'): the `chains` suite's tasks weigh 1
    and the `chains-hard` suite's 0 unless named (so earlier runs' commands draw what they drew)."""
    defaults = {**dict.fromkeys(SUITES["chains"], 1.0), **dict.fromkeys(SUITES["chains-hard"], 0.0)}
    return parse_weights(overrides, defaults, "--chains-weights")


def learn_word_vocabulary(tasks, min_count: int, samples_per_task: int = 400, seed: int = 12345) -> list[str]:
    """Lowercase words (2+ letters) seen at least `min_count` times in training examples.

    Only the train split is read, so no test prompt shapes the vocabulary. Sorted for stability.
    """
    counts: dict[str, int] = {}
    rng = random.Random(seed)
    for task in tasks:
        for _ in range(samples_per_task):
            ex = sample_train_example(task, rng)
            for word in re.findall(r"[a-z]{2,}", ex.prompt + " " + ex.answer):
                counts[word] = counts.get(word, 0) + 1
    return sorted(w for w, c in counts.items() if c >= min_count)


_STEP = re.compile(r"(\d+)([-+*])(\d+)=(\d+)")


def result_span(answer: str, ids: list[int], rng: random.Random):
    """Token span ``(start, end)`` of one random step's result in an arithmetic answer (digits and
    symbols are one token per character), or None if the answer has no step."""
    if len(ids) != len(answer):
        raise ValueError("result masking needs one token per answer character (digits and symbols)")
    steps = list(_STEP.finditer(answer))
    return rng.choice(steps).span(4) if steps else None


def sample_train_example(task, rng: random.Random):
    """A fresh example of the train split: neither a test prompt nor a validation one (`subset_of`),
    so the checkpoint chosen on the validation split never saw its prompts."""
    while True:
        ex = task._make(rng)
        if subset_of(ex.prompt) == "train":
            return ex


def build_batch(tasks, weights, tok, rng: random.Random, batch_size: int, semi_ar: float,
                no_sep: float, gen: torch.Generator, short_resp: float = 0.0,
                full_mask: float = 0.0, min_mask_ratio: float = 0.5, loss_weighting: str = "mean",
                mask_ratio_power: float = 1.0, eos_revealed: float = 0.0,
                semi_ar_blocks: tuple[int, ...] = (8, 16, 32), arithmetic_format: str = "plain",
                result_mask: float = 0.0, row_tasks: list | None = None, row_examples: list | None = None,
                response_len: int = RESPONSE_LEN):
    """Returns input ids [B, L], clean targets [B, L], key mask [B, L], loss weights [B, L].

    `response_len`: the full response length R (64 for the short suites; the `chains` suite's
    batches use its 128-token generation length, see `--chains-share`).

    `row_tasks`: if a list is given, each row's task name is appended to it (row order).
    `row_examples`: likewise, each row's `(task, Example)`.

    `result_mask`: the share of arithmetic rows (task and drill) whose answer is masked from one
    random step's result on, with the whole loss on that result's digits: the state in which a
    result must be computed, since no later step repeats it (the probe's condition, see
    scripts/probe_tiny_dlm_arithmetic.py). Under random masking a result is mostly learned by copying
    it from the next step.

    With probability `short_resp` the whole batch uses a shorter response (its longest answer plus
    1-8 EOS) to save compute; the rest uses the full R = 64 that inference uses.
    """
    prompts, responses, results = [], [], []
    for _ in range(batch_size):
        task = rng.choices(tasks, weights=weights)[0]
        ex = sample_train_example(task, rng)
        if row_tasks is not None:
            row_tasks.append(task.name)
        if row_examples is not None:
            row_examples.append((task, ex))
        p = ex.prompt + ("" if rng.random() < no_sep else PROMPT_SUFFIX)
        arithmetic = task.name in ("arithmetic", ArithmeticDrill.name)
        answer = pad_numbers(ex.answer) if arithmetic_format == "padded" and arithmetic else ex.answer
        a = tok.encode(answer)
        results.append(result_span(answer, a, rng) if arithmetic and rng.random() < result_mask else None)
        assert len(a) < response_len, ex
        prompts.append(tok.encode(p))
        responses.append(a + [tok.eos_token_id] * (response_len - len(a)))
    P = max(len(p) for p in prompts)
    B, R = batch_size, response_len
    if rng.random() < short_resp:
        R = min(response_len, max(len(r) - r.count(tok.eos_token_id) for r in responses)
                + rng.randint(1, 8))
        responses = [r[:R] for r in responses]
    clean = torch.full((B, P + R), tok.pad_token_id, dtype=torch.long)
    att = torch.zeros(B, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        clean[i, P - len(p):P] = torch.tensor(p)
        clean[i, P:] = torch.tensor(r)
        att[i, P - len(p):] = 1

    # t = min + (1 - min) * u**power, u ~ U(0, 1): power > 1 puts more rows at small t, the nearly
    # filled-in responses that one-token-per-step decoding sees at the end of every block.
    t = min_mask_ratio + (1 - min_mask_ratio) * torch.rand(B, generator=gen) ** mask_ratio_power
    # Rows with the whole response masked (t = 1): in small from-scratch runs the mechanism that
    # locates the source of a copied token emerged much sooner with fully masked responses than
    # with partly masked ones (probe on a toy copy task), so a share of them can be mixed in.
    if full_mask > 0:
        t = torch.where(torch.rand(B, generator=gen) < full_mask, torch.ones(B), t)
    u = torch.rand(B, R, generator=gen)
    mask = u < t[:, None]
    # semi-autoregressive rows
    semi = torch.rand(B, generator=gen) < semi_ar
    pos = torch.arange(R)
    block_start = torch.zeros(B, dtype=torch.long)  # semi-AR rows: where the current block starts
    for i in torch.nonzero(semi).flatten().tolist():
        b = rng.choice(semi_ar_blocks)
        start = b * rng.randrange(-(-R // b))
        end = start + b
        m = (u[i] < t[i]) & (pos >= start) & (pos < end)
        m |= pos >= end
        mask[i] = m
        block_start[i] = start
    # EOS-revealed rows: every EOS of the response is visible and only answer tokens are masked.
    # Confidence decoding at one token per step commits the (near-certain) EOS padding first and
    # decides the answer last, against a revealed tail; independent masking at ratio t almost never
    # shows that state ((1 - t)^n_eos * t^n_answer), so without these rows it is out of distribution.
    if eos_revealed > 0:
        rows = (torch.rand(B, generator=gen) < eos_revealed) & ~semi
        is_eos = clean[:, P:] == tok.eos_token_id
        mask[rows] &= ~is_eos[rows]
    # at least one masked position per row (a semi-AR row whose last block drew no mask: its block's
    # first position, so that the row stays a clean prefix followed by masks)
    none = ~mask.any(1)
    if none.any():
        j = torch.where(semi, block_start, torch.randint(0, R, (B,), generator=gen))
        mask[none, j[none]] = True
    frac = mask.float().mean(1)
    t_eff = torch.where(semi, frac, t)
    if loss_weighting == "inverse-t":  # LLaDA's ELBO weighting
        w = mask.float() / (t_eff[:, None] * R)
    elif loss_weighting == "row-mean":
        # Every row counts the same, whatever its mask ratio: with a plain token mean a row at
        # t = 0.1 carries a tenth of the gradient of a row at t = 1, so states near the end of
        # decoding are barely trained. Unlike 1/t this divides by the realised count (bounded).
        w = mask.float() / mask.sum(1, keepdim=True).clamp_min(1)
    else:  # plain mean over the masked tokens of the batch (times B: the caller divides by B)
        w = mask.float() * B / mask.sum().clamp_min(1)

    for i, span in enumerate(results):  # result-masked rows (see `result_mask`)
        if span is not None and span[1] <= R:
            mask[i] = pos >= span[0]
            w[i] = 0.0
            w[i, span[0]:span[1]] = 1.0 if loss_weighting == "row-mean" else B / mask.sum().item()
            w[i, span[0]:span[1]] /= span[1] - span[0]
    x = clean.clone()
    x[:, P:][mask] = tok.mask_token_id
    weights_full = torch.zeros(B, P + R)
    weights_full[:, P:] = w
    return x, clean, att, weights_full, P


def cut_trailing_rows(att: torch.Tensor, w: torch.Tensor, P: int, share: float, gen: torch.Generator) -> None:
    """Cut a share of rows after a random response position c, in place: keys at response positions
    >= c are hidden (`att`) and carry no loss (`w`), and each cut row's loss weights are rescaled
    to their old sum. c is uniform over [first loss position + 1, R], so some loss is always kept.

    Why: an engine that feeds the model only up to the current block's end
    (`generate(cut_trailing_masks=True)`, diffusers' LLaDA2Pipeline's window) shows the model a
    response without its masked tail, a state full-length training never shows. `att`, `w`: `[B, P + R]`.
    """
    if share <= 0:
        return
    B, R = w.shape[0], w.shape[1] - P
    loss_at = (w[:, P:] > 0).cpu()  # the draws are on the CPU generator, whatever w's device
    rows = (torch.rand(B, generator=gen) < share) & loss_at.any(1)
    first = loss_at.float().argmax(1)
    c = first + 1 + (torch.rand(B, generator=gen) * (R - first)).long().clamp(max=R - first - 1)
    keep = torch.arange(R)[None, :] < c[:, None]
    keep = (keep | ~rows[:, None]).to(w.device)
    before = w[:, P:].sum(1, keepdim=True)
    w[:, P:] *= keep
    w[:, P:] *= before / w[:, P:].sum(1, keepdim=True).clamp_min(1e-12)
    att[:, P:] *= keep.to(att.dtype)


@torch.no_grad()
def order_rollout(model, x: torch.Tensor, clean: torch.Tensor, att: torch.Tensor, w: torch.Tensor, P: int,
                  rows: list[int], mask_id: int, eos_id: int, rng: random.Random, chunk: int = 4,
                  block: int = 32, commit_cap: str = "answer") -> None:
    """Put ``rows`` (in place) into states that the model's own confidence decoding produces.

    Each row's response starts fully masked and the model commits its most confident masked positions
    of the current block (``block``, left to right), ``chunk`` per forward, for a random number of
    commits; the committed positions get the *true* tokens (the order is the model's, the content the
    answer's). The loss then covers the positions still masked (weights as ``row-mean``).

    The number of commits is uniform on [0, cap]. ``commit_cap="answer"`` caps it at the answer's
    length + 4 (stage 17). ``"blocks"`` caps it at the end of the block holding the answer's last
    token, minus one. Short answers need "blocks": the model commits the block's EOS padding first,
    so within answer + 4 commits almost no answer token is ever committed.

    Why: random masking rarely shows the states confidence ordering reaches on arithmetic (layout and
    some result digits committed before the operands they depend on), so the model's confidence there
    is untrained and it commits wrong results early. x, w ``[B, P + R]`` are edited; clean, att are not.
    """
    if not rows:
        return
    was_training = model.training
    model.eval()
    R = x.shape[1] - P
    xr, att_rows = clean[rows].clone(), att[rows]
    truth = clean[rows, P:]
    response = xr[:, P:]  # a view: commits below write into xr
    response[:] = mask_id
    dev = x.device
    pos = torch.arange(R, device=dev)
    answer_len = (truth != eos_id).sum(1).tolist()
    if commit_cap not in ("answer", "blocks"):
        raise ValueError(f"commit_cap: expected 'answer' or 'blocks', got {commit_cap!r}")
    caps = [n + 4 if commit_cap == "answer" else -(-n // block) * block - 1 for n in answer_len]
    remaining = torch.tensor([rng.randint(0, max(0, min(R - 1, cap))) for cap in caps], device=dev)
    k = min(chunk, R)
    while bool((remaining > 0).any()):
        conf = model(xr, attention_mask=att_rows).logits[:, P:].softmax(-1).max(-1).values
        masked = response == mask_id
        first = torch.where(masked, pos, R).min(1).values
        in_block = masked & (pos // block == (first // block)[:, None])
        chosen = conf.masked_fill(~in_block, -1.0).argsort(1, descending=True)[:, :k]
        take = torch.minimum(remaining, torch.minimum(torch.full_like(remaining, k), in_block.sum(1)))
        keep = torch.arange(k, device=dev)[None, :] < take[:, None]  # each row's `take` most confident positions
        response.scatter_(1, chosen, torch.where(keep, truth.gather(1, chosen), response.gather(1, chosen)))
        remaining -= take
    masked = xr[:, P:] == mask_id
    x[rows] = xr
    w[rows] = 0.0
    w[rows, P:] = masked.float() / masked.sum(1, keepdim=True).clamp_min(1)
    model.train(was_training)


def soft_answer_targets(x: torch.Tensor, P: int, row_examples: list, tok, mask_id: int):
    """Soft targets for the hidden name slots of random list edits (shuffle, insert / replace at random).

    Such a prompt has many valid answers, and the sampled one is a single draw: given the names
    already shown, a hidden slot's true posterior is spread over every name that some consistent
    valid answer puts there (`slot_marginals`; for shuffle, every name not yet shown). The one-hot
    target of the sampled answer is an unbiased but noisy estimate of that posterior; the posterior
    itself (Rao-Blackwellised target) says outright that a name already shown cannot come again,
    the rule the model breaks when it repeats a committed name at one token per step.

    x: `[B, P + R]` the (masked) batch; the answer's name k sits at response position 2k (names are
    single tokens separated by ' '). Returns `(rows, cols, q)`: the hidden slots' coordinates in x
    (long `[N]` each) and their target distributions `q [N, V]`; N = 0 if no row qualifies.
    """
    rows, cols, targets = [], [], []
    for i, (task, ex) in enumerate(row_examples):
        if not getattr(task, "random_edit", False):
            continue
        names = ex.answer.split()
        ids = [tok.encode(n) for n in names]
        if any(len(t) != 1 for t in ids):
            raise ValueError(f"soft targets need single-token names; {names} encodes as {ids}")
        slots = [P + 2 * k for k in range(len(names))]
        shown = [None if int(x[i, c]) == mask_id else tok.decode([int(x[i, c])]) for c in slots]
        for c, seen, marginal in zip(slots, shown, task.slot_marginals(ex, shown)):
            if seen is not None:
                continue
            q = torch.zeros(tok.vocab_size)
            for name, prob in marginal.items():
                q[tok.encode(name)[0]] = prob
            rows.append(i)
            cols.append(c)
            targets.append(q)
    if not targets:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0, tok.vocab_size)
    return torch.tensor(rows), torch.tensor(cols), torch.stack(targets)


def parse_rollout_tasks(text: str, tasks) -> set[str]:
    """'arithmetic,shuffle' -> the task names whose rows `order_rollout` may take. 'arithmetic' also
    names the drills (they share its answer format). ValueError naming --rollout-tasks otherwise."""
    known = {t.name for t in tasks}
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(names - known)
    if not names or unknown:
        raise ValueError(f"--rollout-tasks: unknown task(s) {unknown or [text]}; "
                         f"choose from {sorted(known)}")
    if "arithmetic" in names:
        names.add(ArithmeticDrill.name)
    return names


def rollout_rows(row_tasks: list[str], rollout_tasks: set[str], share: float, rng: random.Random) -> list[int]:
    """Indices of the rows to roll out: each row of a named task with probability `share`."""
    return [i for i, name in enumerate(row_tasks) if name in rollout_tasks and rng.random() < share]


@torch.no_grad()
def quick_decode(model, tok, prompts: list[str], steps: int = RESPONSE_LEN, block: int = 32):
    """Greedy confidence decoding of a left-padded batch with the engine (`dlm.generate`)."""
    ids, att = tok.pad_batch([tok.encode(p + PROMPT_SUFFIX) for p in prompts])
    device = next(model.parameters()).device
    ids, att = torch.tensor(ids, device=device), torch.tensor(att, device=device)
    out = generate(model, ids, attention_mask=att, gen_length=RESPONSE_LEN, block_length=block, steps=steps,
                   sampler="confidence", mask_token_id=tok.mask_token_id)
    return tok.batch_decode(out.sequences[:, ids.shape[1]:])


def quick_eval(model, tok, tasks, n_per_task: int, seed: int = 123, steps: int = 32):
    """Accuracy during training, on the validation split (what a run's progress is judged on; the test
    split is only read to report a chosen checkpoint, scripts/eval_tiny_dlm.py --split test)."""
    model.eval()
    exs = []
    for t in tasks:
        exs += [(t, ex) for ex in t.examples("val", n_per_task, seed=seed)]
    outs = quick_decode(model, tok, [ex.prompt for _, ex in exs], steps=steps, block=32)
    model.train()
    acc = {}
    for (t, ex), o in zip(exs, outs):
        acc.setdefault(t.name, []).append(t.score(ex, o))
    return {k: sum(v) / len(v) for k, v in acc.items()}, outs


def save(model, tok, out: Path, step: int, loss: float, args, trainer_state: dict | None = None):
    """Write the checkpoint folder atomically (a .tmp folder renamed over `out`); with `trainer_state`
    also `trainer_state.pt` (float32 weights, optimizer, step, elapsed time, RNG states) for --resume."""
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model_half = TinyDLMModel(model.config)
    model_half.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    # bfloat16 on disk keeps the file small; the config says float32 so that loaders
    # (AutoModel, load_tiny_dlm) upcast by default.
    model_half.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok.save_pretrained(tmp)
    (tmp / "training_state.json").write_text(json.dumps(
        {"step": step, "loss": loss, "args": vars(args)}, indent=2))
    if trainer_state is not None:
        torch.save(trainer_state, tmp / "trainer_state.pt")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


# Options that may change between a run and its --resume (they do not change what is trained).
RESUME_MAY_DIFFER = {"resume", "max_steps", "threads", "log_every", "eval_every_min", "save_every_min",
                     "save_every_steps", "eval_n", "device"}


def trainer_state(model, opt, step, elapsed, ema, rng, gen, args) -> dict:
    """Everything --resume needs to go on as if the run had not stopped."""
    return {"model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
            "optimizer": opt.state_dict(), "step": step, "elapsed": elapsed, "ema": ema, "rng": rng.getstate(),
            "torch_rng": torch.get_rng_state(), "gen": gen.get_state(), "args": vars(args)}


def load_trainer_state(out: Path, args, ap) -> dict:
    """The state saved in `out` by an earlier run of the same options (ap.error otherwise)."""
    path = out / "trainer_state.pt"
    if not path.is_file():
        ap.error(f"--resume: no {path}; start without --resume (checkpoints with it are written every "
                 "--save-every-min minutes or --save-every-steps steps)")
    try:
        state = torch.load(path, weights_only=False)
    except Exception as err:  # a truncated or foreign file
        ap.error(f"--resume: cannot read {path} ({type(err).__name__}: {err}); the checkpoint is damaged")
    old, new = state["args"], vars(args)
    diff = [k for k in dict.fromkeys(list(old) + list(new)) if k not in RESUME_MAY_DIFFER and old.get(k) != new.get(k)]
    if diff:
        ap.error("--resume: the checkpoint was trained with other options: "
                 + "; ".join(f"--{k.replace('_', '-')} {old.get(k)!r} there, {new.get(k)!r} now" for k in diff))
    return state


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/tiny_dlm_run")
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--max-minutes", type=float, default=50.0,
                    help="wall-time cap; the cosine schedule is laid out over this time")
    ap.add_argument("--semi-ar", type=float, default=0.4)
    ap.add_argument("--semi-ar-blocks", default="8,16,32",
                    help="block sizes a semi-AR row draws from; 1 gives a clean prefix and a masked suffix")
    ap.add_argument("--no-sep", type=float, default=0.0)
    ap.add_argument("--min-mask-ratio", type=float, default=0.5,
                    help="mask ratio t ~ U(min, 1). LLaDA uses ~0; on a toy copy task with this model, "
                         "U(0.5, 1) with --loss-weighting mean reached 100%% copy accuracy by step 200 "
                         "while U(0, 1) with 1/t weighting was at 14%% after 300")
    ap.add_argument("--loss-weighting", choices=("mean", "row-mean", "inverse-t"), default="mean",
                    help="mean: over all masked tokens of the batch; row-mean: mean per row, rows "
                         "weighted equally; inverse-t: LLaDA's 1/t weighting normalised by R")
    ap.add_argument("--mask-ratio-power", type=float, default=1.0,
                    help="t = min + (1 - min) * u**power with u ~ U(0, 1); > 1 favours small t")
    ap.add_argument("--eos-revealed", type=float, default=0.0,
                    help="share of (non-semi-AR) rows whose EOS padding is all unmasked, answer masked at ratio t")
    ap.add_argument("--device", default="cpu", help="torch device for training (batches are built on CPU)")
    ap.add_argument("--full-mask", type=float, default=0.0,
                    help="fraction of (non semi-AR) rows whose whole response is masked (t = 1)")
    ap.add_argument("--short-resp", type=float, default=0.5,
                    help="fraction of batches trained with a response cut to answer + 1-8 EOS")
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--chains-share", type=float, default=0.0,
                    help="share of batches drawn from the `chains` suite (long sequential answers, "
                         "response length 128) instead of --tasks; 0: none")
    ap.add_argument("--chains-weights", default="",
                    help="sampling weights within the chains batches, e.g. 'count=1,walk=2'")
    ap.add_argument("--chains-min-items", type=int, default=0,
                    help="train the chains tasks on lengths from this many items up to the suite's most "
                         "(a curriculum: short chains teach the step rule; 0: the suite's own range)")
    ap.add_argument("--max-positions", type=int, default=192,
                    help="max_position_embeddings of the config (raised on an --init checkpoint too): "
                         "prompt plus response must fit; chains need 320")
    ap.add_argument("--arith-drill", type=float, default=0.0,
                    help="weight of one-operation arithmetic drills (dlm.tasks.arithmetic.ArithmeticDrill, "
                         "training only) added to the task mix; 0: none")
    ap.add_argument("--result-mask", type=float, default=0.0,
                    help="share of arithmetic rows masked from one step's result on, loss on that result only")
    ap.add_argument("--arithmetic-format", choices=("plain", "padded"), default="plain",
                    help="worked steps of the arithmetic answers as the task writes them, or with every "
                         "number zero-padded to two digits (see pad_numbers)")
    ap.add_argument("--order-rollout", type=float, default=0.0,
                    help="share of the --rollout-tasks rows put into the states the model's own confidence "
                         "decoding reaches (see order_rollout)")
    ap.add_argument("--rollout-commits", choices=("answer", "blocks"), default="answer",
                    help="cap of a rollout's number of commits: the answer's length + 4, or the end of the "
                         "block holding the answer's end (see order_rollout)")
    ap.add_argument("--soft-random-targets", action="store_true",
                    help="train the hidden name slots of shuffle / insert / replace at random on the "
                         "posterior over valid answers instead of the sampled answer (see soft_answer_targets)")
    ap.add_argument("--rollout-tasks", default="arithmetic",
                    help="comma-separated task names whose rows --order-rollout may take; 'arithmetic' "
                         "includes the drills (see rollout_rows)")
    ap.add_argument("--task-weights", default="",
                    help="overrides of the sampling weights, e.g. 'copy=1.5,sudoku=0.75'")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--eval-every-min", type=float, default=8.0)
    ap.add_argument("--save-every-min", type=float, default=5.0)
    ap.add_argument("--save-every-steps", type=int, default=0, help="also save every N steps (0: by time only)")
    ap.add_argument("--resume", action="store_true",
                    help="go on from --out's trainer_state.pt (same options; step, optimizer, clock and RNG restored)")
    ap.add_argument("--eval-n", type=int, default=4)
    ap.add_argument("--init", default=None, help="resume weights (and tokenizer) from a checkpoint dir")
    ap.add_argument("--restart-positions", type=int, default=1,
                    help="1: rotary positions restart after the prompt separator (see dlm_position_ids)")
    ap.add_argument("--prompt-causal", action="store_true",
                    help="the prompt attends only to itself (config prompt_attends_response=False): "
                         "a prompt KV cache becomes exact")
    ap.add_argument("--cut-trailing", type=float, default=0.0,
                    help="share of rows cut after a random response position (see cut_trailing_rows)")
    ap.add_argument("--word-min-count", type=int, default=3,
                    help="words seen this often in training data become single tokens (0: characters only)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    tasks = get_suite(args.tasks)
    if args.arith_drill > 0:
        tasks = tasks + [ArithmeticDrill()]
    try:
        rollout_tasks = parse_rollout_tasks(args.rollout_tasks, tasks)
    except ValueError as err:
        ap.error(str(err))
    out = Path(args.out)
    resumed = load_trainer_state(out, args, ap) if args.resume else None
    if resumed is not None:
        tok = TinyCharTokenizer.from_pretrained(out)
    elif args.init:
        tok = TinyCharTokenizer.from_pretrained(args.init)
    else:
        tok = TinyCharTokenizer(words=learn_word_vocabulary(tasks, args.word_min_count) if args.word_min_count else ())
    print(f"vocabulary {tok.vocab_size} tokens ({len(tok.words)} whole words)", flush=True)
    weight_of = task_weights(args.task_weights)
    weights = [args.arith_drill if t.name == ArithmeticDrill.name else weight_of.get(t.name, 1.0) for t in tasks]
    chain_tasks = get_suite("chains") + get_suite("chains-hard") if args.chains_share > 0 else []
    for task in chain_tasks if args.chains_min_items else ():
        task.min_items = min(task.min_items, args.chains_min_items)  # this instance only: the suite keeps its range
    chain_weight_of = chain_weights(args.chains_weights)
    chain_task_weights = [chain_weight_of[t.name] for t in chain_tasks]  # every chains task has a default
    cfg = TinyDLMConfig(
        vocab_size=tok.vocab_size, hidden_size=args.hidden_size, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, intermediate_size=args.intermediate,
        max_position_embeddings=args.max_positions, mask_token_id=tok.mask_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        position_restart_token_id=tok.encode(PROMPT_SUFFIX)[0] if args.restart_positions else None)
    if args.init and resumed is None:
        model = TinyDLMModel.from_pretrained(args.init, dtype=torch.float32)
    else:
        model = TinyDLMModel(cfg)
    if args.prompt_causal:
        model.config.prompt_attends_response = False
    # Rotary positions are computed on the fly, so the limit is only the config's length check.
    model.config.max_position_embeddings = max(model.config.max_position_embeddings, args.max_positions)
    if resumed is not None:
        model.load_state_dict(resumed["model"])
    device = torch.device(args.device)
    model.to(device)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params / 1e6:.2f}M  tasks {[t.name for t in tasks]}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98))
    t0 = time.time()
    budget = args.max_minutes * 60
    last_eval = last_save = t0
    ema = None
    step = 0
    if resumed is not None:  # the wall-time LR schedule goes on from the saved clock
        opt.load_state_dict(resumed["optimizer"])
        step, ema, t0 = resumed["step"], resumed["ema"], t0 - resumed["elapsed"]
        rng.setstate(resumed["rng"])
        torch.set_rng_state(resumed["torch_rng"])
        gen.set_state(resumed["gen"])
        print(f"resumed from {out} at step {step} ({resumed['elapsed'] / 60:.1f} min trained)", flush=True)
    while step < args.max_steps:
        elapsed = time.time() - t0
        if elapsed > budget:
            break
        # Schedule in wall time, so the cosine ends when the time cap does.
        frac = min(1.0, elapsed / budget)
        if step < args.warmup:
            lr = args.lr * (step + 1) / args.warmup
        else:
            lr = args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        row_examples: list = []  # (task, Example) per row: rollout picks rows by task, soft targets read the example
        chains_batch = bool(chain_tasks) and rng.random() < args.chains_share
        batch_tasks, batch_weights = (chain_tasks, chain_task_weights) if chains_batch else (tasks, weights)
        x, clean, att, w, P = build_batch(batch_tasks, batch_weights, tok, rng, args.batch_size,
                                          args.semi_ar, args.no_sep, gen, args.short_resp,
                                          args.full_mask, args.min_mask_ratio, args.loss_weighting,
                                          args.mask_ratio_power, args.eos_revealed,
                                          tuple(int(b) for b in args.semi_ar_blocks.split(",")),
                                          args.arithmetic_format, args.result_mask, row_examples=row_examples,
                                          response_len=CHAIN_GEN_LENGTH if chains_batch else RESPONSE_LEN)
        x, clean, att, w = (v.to(device) for v in (x, clean, att, w))
        if args.order_rollout > 0:
            rows = rollout_rows([task.name for task, _ in row_examples], rollout_tasks, args.order_rollout, rng)
            order_rollout(model, x, clean, att, w, P, rows, tok.mask_token_id, tok.eos_token_id, rng,
                          commit_cap=args.rollout_commits)
        cut_trailing_rows(att, w, P, args.cut_trailing, gen)
        logits = model(x, attention_mask=att).logits
        ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), clean.view(-1), reduction="none").view_as(w)
        if args.soft_random_targets:
            soft_rows, soft_cols, q = soft_answer_targets(x, P, row_examples, tok, tok.mask_token_id)
            if len(soft_rows):
                soft_rows, soft_cols = soft_rows.to(device), soft_cols.to(device)
                soft_ce = -(q.to(device) * logits[soft_rows, soft_cols].log_softmax(-1)).sum(-1)
                ce = ce.index_put((soft_rows, soft_cols), soft_ce)
        loss = (ce * w).sum() / x.shape[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        lv = loss.item()
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        if step % args.log_every == 0:
            el = time.time() - t0
            print(f"step {step} loss {lv:.4f} ema {ema:.4f} gnorm {gnorm:.2f} lr {lr:.2e} "
                  f"elapsed {el / 60:.1f}m ({el / step:.2f}s/step)", flush=True)
        now = time.time()
        if now - last_save > args.save_every_min * 60 or (args.save_every_steps and step % args.save_every_steps == 0):
            save(model, tok, out, step, ema, args, trainer_state(model, opt, step, now - t0, ema, rng, gen, args))
            last_save = now
        if now - last_eval > args.eval_every_min * 60:
            acc, outs = quick_eval(model, tok, tasks, args.eval_n)
            print("eval " + " ".join(f"{k}={v:.2f}" for k, v in acc.items()), flush=True)
            print("  sample:", repr(outs[0]), "|", repr(outs[-1]), flush=True)
            last_eval = time.time()
    save(model, tok, out, step, ema if ema is not None else float("nan"), args,
         trainer_state(model, opt, step, time.time() - t0, ema, rng, gen, args))
    el = time.time() - t0
    print(f"done: {step} steps in {el / 60:.1f} min, final ema loss {ema:.4f}; saved to {out}",
          flush=True)
    acc, _ = quick_eval(model, tok, tasks, 8)
    print("final quick eval (8/task, 32 steps) " + " ".join(f"{k}={v:.2f}" for k, v in acc.items()),
          flush=True)


if __name__ == "__main__":
    main()
