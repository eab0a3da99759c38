"""Plain-torch transcriptions of the seed samplers' reference loops, one prompt at a time.

Written for the tests from a reading of the authors' code (no code copied): each function follows
one released loop step by step, with the authors' data layout (the whole sequence `[L]`, prompt
included) and the same `torch` calls where their order among equal values matters (`torch.topk`),
so that a published mode of ours can be compared token for token. Greedy decoding, no KV cache,
no end-of-text stop, batch 1, as the authors' loops run.

- `saber_loop`: zhaoyMa/Saber, `decoding.py::generate_with_saber` (LLaDA, arXiv:2510.18165).
- `lopa_loop`: zhijie-group/LoPA, `scale_dream_d2f/scale_dream_d2f.py`, the round of
  `_generate_enhanced_speculative` with the released Dream flags (sampling_strategy neg_entropy,
  selection_conf_alpha 0, branch_topp 1, branch_verification_mode and base_branch_competition on,
  one block added when the last one is complete), run on the whole canvas.
- `llada_blocks_loop` and `hex_vote`: junos-ai-org/hex, `HEX/eval/generate.py::generate` with
  low-confidence remasking (one HEX expert) and the `'frequency'` rule with `select_first` of
  `HEX_run_by_given_json_samples.py` (the vote).

`model_fn(x [1, L]) -> logits [1, L, V]` is the model as our engine hands it to every sampler:
the mask token's logit at -inf (`engine_logits`), since a masked LM may rank the mask itself first.
"""
from __future__ import annotations

from collections import Counter

import torch


def engine_logits(model, mask_id: int):
    """`x -> logits` of `model` in float32 with the mask token at -inf (what our driver does)."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        out = model(x)
        logits = (out.logits if hasattr(out, "logits") else out).float().clone()
        logits[..., mask_id] = float("-inf")
        return logits

    return fn


# ----------------------------------------------------------------------------------------- Saber
@torch.no_grad()
def saber_loop(model_fn, prompt: torch.Tensor, gen_length: int, block_length: int, mask_id: int, n: int = 2):
    """`generate_with_saber` at temperature 0. Returns `(x [1, P + gen_length], forwards)`.

    Per forward, over the sequence up to the current block's end: x0 = argmax and p = its
    probability at every generation position; delta = p - p at the previous forward (starting from
    0; a position that was past the block end before gets +inf); the threshold is the mean of the
    probabilities recorded when tokens were committed (a remasked token keeps its record; 1 when
    none); every uncommitted position above it is committed, else the top n by p (`torch.topk`,
    which may pick an already-committed or out-of-block position when fewer than n are left, as in
    the reference); then, unless the block is full, the committed positions with the smallest delta
    (`torch.topk(largest=False)`), min(max(n // 2, ceil(fix / 8)), fix - 1) of them, are masked again.
    """
    P = prompt.shape[1]
    x = torch.cat([prompt, torch.full((1, gen_length), mask_id, dtype=torch.long)], dim=1)
    L = x.shape[1]
    generated = torch.zeros(1, L, dtype=torch.bool)
    generated[:, P:] = True  # the positions that started as masks
    committed = torch.zeros(1, L, dtype=torch.bool)
    recorded = torch.full((1, L), float("-inf"))  # probability at the latest commit, never cleared
    previous = torch.zeros(1, L)  # p at the previous forward; 0 before the first one
    forwards = 0
    for block in range(gen_length // block_length):
        end = P + (block + 1) * block_length
        while True:
            forwards += 1
            logits = model_fn(x)
            probs = torch.softmax(logits, dim=-1)
            x0 = logits.argmax(dim=-1)
            p = probs.gather(-1, x0.unsqueeze(-1)).squeeze(-1)
            p[:, end:] = float("-inf")
            x0 = torch.where(generated, x0, x)
            conf = torch.where(generated, p, torch.full_like(p, float("-inf")))
            delta = conf - previous
            delta = torch.where(torch.isfinite(delta), delta, torch.full_like(delta, float("inf")))
            previous = conf
            conf = torch.where(committed, torch.full_like(conf, float("-inf")), conf)

            held = recorded[0, :end]
            held = held[held > float("-inf")]
            threshold = held.mean() if held.numel() > 0 else 1
            chosen = torch.nonzero(conf[0] > threshold).squeeze(1)
            if chosen.numel() < n:
                chosen = torch.topk(conf[0], k=n).indices
            fix = max(n, chosen.numel())
            take = torch.zeros_like(committed)
            take[0, chosen] = True
            x = torch.where(take, x0, x)
            committed |= take
            recorded = torch.where(take, p, recorded)

            if bool(committed[generated].all()):
                return x, forwards
            if bool((x[:, :end] != mask_id).all()):
                break
            drop_score = torch.where(generated, delta, torch.full_like(delta, float("inf")))
            drop_score[:, end:] = float("inf")
            drop_score[x == mask_id] = float("inf")
            count = min(max(n // 2, (fix + 7) // 8), fix - 1)
            drop = torch.topk(drop_score[0], k=count, largest=False).indices
            x[0, drop] = mask_id
            committed[0, drop] = False
    return x, forwards


# ------------------------------------------------------------------------------------------ LoPA
NEG_ENTROPY_EPS = 1e-10  # the released scripts' sum p log(p + 1e-10)


def _dream_confidence(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sample_tokens(..., sampling_strategy="neg_entropy")` at temperature 0 on logits `[..., V]`:
    `(negative entropy, argmax token, its probability)`, each `[...]`."""
    probs = torch.softmax(logits, dim=-1)
    top, token = probs.max(dim=-1)
    return (probs * torch.log(probs + NEG_ENTROPY_EPS)).sum(dim=-1), token, top


class _Candidate:
    """One branch of the reference: its sequence `[L]`, how many generation blocks it has added,
    whether it is the base (the winner's own fill) and its creation number (ties go to the lower)."""

    def __init__(self, x: torch.Tensor, opened: int, is_base: bool, number: int):
        self.x, self.opened, self.is_base, self.number = x, opened, is_base, number


@torch.no_grad()
def lopa_loop(model_fn, prompt: torch.Tensor, gen_length: int, block_length: int, mask_id: int,
              branching_factor: int = 2, tau: float = 0.9):
    """The LoPA round of the released Dream script at temperature 0, one block at a time (a block is
    added to a branch once its last block is complete), on the whole canvas (every later block
    holds masks, as our engine's input does). Returns `(x [1, P + gen_length], forwards)`, forwards
    being the rounds that ran the model before the returned branch was found complete.

    Per round: every candidate branch runs the model on its own; each is scored by the mean negative
    entropy of the masks in its added blocks (1.0 when none); a stable sort on the score, lookahead
    branches in creation order first and the base last, picks the winner. The winner's blocks are
    filled from its logits: every mask with top probability > tau, else (nothing above tau) the one
    mask of highest negative entropy. Then `branching_factor` new branches each fill one more of the
    remaining masks, those of highest negative entropy, with its argmax, and the filled winner
    itself comes last as the base. A candidate with no mask left once every block is added is the
    output (the reference returns the branch that completed in the fewest rounds).
    """
    P, num_blocks = prompt.shape[1], gen_length // block_length
    x = torch.cat([prompt, torch.full((1, gen_length), mask_id, dtype=torch.long)], dim=1)[0]

    def region(c: _Candidate) -> slice:
        return slice(P, P + c.opened * block_length)

    candidates = [_Candidate(x, 0, True, 0)]
    created, forwards = 1, 0
    while True:
        for c in candidates:  # add a block to a branch whose last block is complete
            if c.opened < num_blocks and not bool((c.x[region(c)] == mask_id).any()):
                c.opened += 1
        for c in candidates:
            if c.opened == num_blocks and not bool((c.x[P:] == mask_id).any()):
                return c.x.unsqueeze(0), forwards
        forwards += 1
        order = sorted(candidates, key=lambda c: (c.is_base, c.number))
        scored = []
        for c in order:
            logits = model_fn(c.x.unsqueeze(0))[0]
            masks = torch.nonzero(c.x[region(c)] == mask_id).squeeze(1) + P
            if masks.numel() == 0:
                score = 1.0
            else:
                score = _dream_confidence(logits[masks])[0].mean().item()
            scored.append((score, c, logits))
        scored.sort(key=lambda t: t[0], reverse=True)
        _, best, logits = scored[0]

        # the fill of the winner's open block (one block at a time: it must progress)
        winner = best.x.clone()
        masks = torch.nonzero(winner[region(best)] == mask_id).squeeze(1) + P
        if masks.numel():
            negent, token, top = _dream_confidence(logits[masks])
            high = torch.nonzero(top > tau).squeeze(1)
            fill = high if high.numel() else torch.topk(negent, 1).indices
            winner[masks[fill]] = token[fill]

        # the next round's candidates: one more token each, then the base
        left = [int(i) + P for i in torch.nonzero(winner[region(best)] == mask_id).squeeze(1)]
        negent, token, _ = _dream_confidence(logits)
        ranked = sorted(((negent[i].item(), i) for i in left), key=lambda t: t[0], reverse=True)
        candidates = []
        for _, i in ranked[:branching_factor]:
            branch = winner.clone()
            branch[i] = token[i]
            candidates.append(_Candidate(branch, best.opened, False, created))
            created += 1
        candidates.append(_Candidate(winner, best.opened, True, created))
        created += 1


# ------------------------------------------------------------------------------------------- HEX
@torch.no_grad()
def llada_blocks_loop(model_fn, prompt: torch.Tensor, gen_length: int, block_length: int, steps: int,
                      mask_id: int):
    """One HEX expert: LLaDA's semi-autoregressive `generate` with low-confidence remasking at
    temperature 0, as the HEX repository runs it. Returns `(x [1, P + gen_length], forwards)`.

    Each block gets steps / blocks forwards; its masks are spread over them as LLaDA's
    `get_num_transfer_tokens` does (the first `count % steps` steps take one more); each forward
    commits that many masks of the block, those whose argmax has the highest probability
    (softmax in float64, `torch.topk`)."""
    P = prompt.shape[1]
    x = torch.cat([prompt, torch.full((1, gen_length), mask_id, dtype=torch.long)], dim=1)
    blocks = gen_length // block_length
    per_block = steps // blocks
    forwards = 0
    for b in range(blocks):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        count = int((x[0, lo:hi] == mask_id).sum())
        plan = [count // per_block + (1 if i < count % per_block else 0) for i in range(per_block)]
        i = 0
        while True:
            forwards += 1
            masked = x == mask_id
            masked[:, hi:] = False
            logits = model_fn(x)
            x0 = logits.argmax(dim=-1)
            p = torch.softmax(logits.double(), dim=-1).gather(-1, x0.unsqueeze(-1)).squeeze(-1)
            x0 = torch.where(masked, x0, x)
            conf = torch.where(masked, p, torch.full_like(p, float("-inf")))
            pick = torch.topk(conf[0], k=plan[i]).indices
            x[0, pick] = x0[0, pick]
            i += 1
            if not bool((x[0, lo:hi] == mask_id).any()):
                break
    return x, forwards


def hex_vote(answers: list) -> int | None:
    """Index of the expert whose answer the HEX repository's vote returns: answers that are None
    are dropped, the most frequent answer wins, and among equally frequent answers the one met
    first (`Counter` keeps insertion order; `select_first` takes the first). None if all are None."""
    kept = [(i, a) for i, a in enumerate(answers) if a is not None]
    if not kept:
        return None
    counts = Counter(a for _, a in kept)
    top = max(counts.values())
    winner = next(a for a in counts if counts[a] == top)
    return next(i for i, a in kept if a == winner)
