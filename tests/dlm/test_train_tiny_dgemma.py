"""tiny-dgemma's training loss (scripts/train_tiny_dgemma.py) and the shipped checkpoint.

The loss batches every canvas of a sequence into one encoder and one decoder pass; these tests pin
that to transformers' own per-canvas path (what `generate` runs), check the self-conditioning path
against how generate feeds logits back, and check that a few optimizer steps lower the loss.
"""
import random

import pytest
import torch

from dlm.tasks import get_suite, split_of
from dlm.tiny.dgemma import CHECKPOINT_DIR, EOS_ID, is_validation, tiny_dgemma_config
from dlm.tiny.tokenizer import TinyCharTokenizer

from script_loader import load_script  # tests/script_loader.py (tests/ is on sys.path)

transformers = pytest.importorskip("transformers")
from transformers import DiffusionGemmaForBlockDiffusion  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: a second intra-op thread only adds synchronisation, and on a loaded
    2-core machine it made a training step ~100x slower (4 s instead of 30 ms)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def train():
    return load_script("train_tiny_dgemma.py")


@pytest.fixture(scope="module")
def tok():
    return TinyCharTokenizer.from_pretrained(CHECKPOINT_DIR.parent / "tiny-dlm")


def _model(tok, canvas_length=4, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = tiny_dgemma_config(tok.vocab_size, hidden_size=32, layers=2, heads=2, kv_heads=1, head_dim=16,
                             intermediate_size=32, num_experts=2, top_k_experts=1, moe_intermediate_size=16,
                             canvas_length=canvas_length, **kw)
    return DiffusionGemmaForBlockDiffusion(cfg)


PAIRS = [("copy: ana bo", "ana bo"), ("sort: cyd ana bo eli", "ana bo cyd eli"),
         ("reverse: jo kai lev mia ned", "ned mia lev kai jo")]


def test_batch_layout_and_shapes(train, tok):
    b = train.make_batch(PAIRS, tok, 4)
    P, K = b["prompt_len"], b["canvases"]
    assert b["input_ids"].shape == (3, P + 4 * K) == b["attention"].shape
    # answers of 2, 4 and 5 words: 3, 7 and 9 tokens + at least one EOS -> 1, 2, 3 canvases
    assert K == 3 and b["canvas_valid"].tolist() == [[True, False, False], [True, True, False], [True] * 3]
    for i, (prompt, answer) in enumerate(PAIRS):
        p = tok.encode_prompt(prompt)
        assert b["input_ids"][i, P - len(p):P].tolist() == p
        assert not b["attention"][i, :P - len(p)].any() and b["attention"][i, P - len(p):].all()
        canvases = b["input_ids"][i, P:].tolist()
        a = tok.encode(answer)
        assert canvases[:len(a)] == a and set(canvases[len(a):]) == {EOS_ID}
    enc = train.encoder_mask(b["attention"])
    dec = train.decoder_mask(b["attention"], P, K, 4)
    assert enc.shape == (3, 1, P + 4 * K, P + 4 * K) and dec.shape == (3, 1, 4 * K, P + 8 * K)


def test_uniform_corruption_rates(train):
    gen = torch.Generator().manual_seed(0)
    clean = torch.full((64, 3, 16), 5)
    noisy, rates = train.uniform_corrupt(clean, 117, gen)
    assert noisy.shape == clean.shape and rates.shape == (64, 3)
    assert ((rates >= 0) & (rates <= 1)).all()
    changed = (noisy != clean).float().mean(-1)
    # a replaced token equals the clean one with probability 1/117
    assert torch.allclose(changed, rates * 116 / 117, atol=0.35)
    assert abs(changed.mean().item() - rates.mean().item() * 116 / 117) < 0.03
    assert noisy.max() < 117 and noisy.min() >= 0
    all_noise, _ = train.uniform_corrupt(clean, 117, gen, min_rate=1.0)
    assert (all_noise != 5).float().mean() > 0.95


def test_batched_canvases_equal_transformers_per_canvas_path(train, tok):
    """One encoder pass + all canvases in one decoder pass == transformers' forward per canvas with the
    clean prefix as prompt (no padding, positions from 0), self-conditioning on one row only."""
    model = _model(tok).eval()
    b = train.make_batch(PAIRS, tok, 4)
    P, K, C = b["prompt_len"], b["canvases"], 4
    gen = torch.Generator().manual_seed(1)
    noisy = torch.randint(0, tok.vocab_size, (3, K * C), generator=gen)
    sc = torch.randn(3, K * C, tok.vocab_size, generator=gen)
    sc_mask = torch.tensor([True, False, True])
    with torch.no_grad():
        logits = train.decode_canvases(model, train.encode_clean(model, b), b, noisy, sc, sc_mask)
        assert logits.shape == (3, K * C, tok.vocab_size)
        checked = 0
        for i in range(3):
            real = int(b["attention"][i].sum()) - K * C
            seq = b["input_ids"][i, P - real:]
            for k in range(K):
                if not b["canvas_valid"][i, k]:
                    continue
                cols = slice(k * C, (k + 1) * C)
                ref = model(input_ids=seq[None, :real + k * C], decoder_input_ids=noisy[i:i + 1, cols],
                            self_conditioning_logits=sc[i:i + 1, cols] if sc_mask[i] else None).logits[0]
                torch.testing.assert_close(logits[i, cols], ref, atol=2e-5, rtol=1e-5)
                checked += 1
    assert checked == 6


def test_self_conditioning_feeds_detached_temperature_scaled_first_pass(train, tok):
    """With self_cond=1 the decoder runs twice: first with no self-conditioning (as generate's first
    step), then with the first logits divided by one temperature per row in --sc-temp, detached, in the
    embeddings' dtype (as generate's `processed_logits.to(embeddings_dtype)`)."""
    model = _model(tok)
    calls = []
    forward = model.forward

    def recording_forward(*args, **kwargs):
        out = forward(*args, **kwargs)
        calls.append((kwargs.get("self_conditioning_logits"), kwargs.get("self_conditioning_mask"), out.logits))
        return out

    model.forward = recording_forward
    b = train.make_batch(PAIRS, tok, 4)
    loss, stats = train.dgemma_loss(model, b, torch.Generator().manual_seed(0), self_cond=1.0, sc_temp=(0.4, 0.8))
    assert len(calls) == 2 and stats["sc_share"] == 1.0
    (sc0, m0, first), (sc1, m1, _) = calls
    assert sc0 is None and m1.all()
    assert not sc1.requires_grad and sc1.dtype == model.model.decoder.embed_tokens.weight.dtype
    f, s = first.detach().flatten(1), sc1.flatten(1)
    temp = (f * s).sum(1) / (s * s).sum(1)   # the one T per row that maps sc1 back to the first logits
    torch.testing.assert_close(s * temp[:, None], f, atol=1e-5, rtol=1e-5)
    assert ((temp >= 0.4) & (temp <= 0.8)).all() and temp.unique().numel() == 3
    loss.backward()   # gradients flow through the second pass only
    calls.clear()
    train.dgemma_loss(model, b, torch.Generator().manual_seed(0), self_cond=0.0)
    assert len(calls) == 1 and calls[0][0] is None


def test_few_steps_lower_the_loss_on_a_toy_batch(train, tok):
    model = _model(tok, seed=3)
    b = train.make_batch(PAIRS, tok, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def fixed_loss():
        with torch.no_grad():
            return train.dgemma_loss(model, b, torch.Generator().manual_seed(123), self_cond=0.5)[0].item()

    before = fixed_loss()
    gen = torch.Generator().manual_seed(7)
    for _ in range(15):
        loss, _ = train.dgemma_loss(model, b, gen, self_cond=0.5)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = fixed_loss()
    assert after < 0.6 * before, (before, after)


def test_training_examples_avoid_test_and_validation_prompts(train):
    rng = random.Random(0)
    tasks = train.training_tasks()
    for name in ("reverse", "arithmetic", "sudoku"):
        for _ in range(200):
            prompt, answer = train.sample_example(tasks[name], rng, padded=True)
            assert split_of(prompt) == "train" and not is_validation(prompt)
    with pytest.raises(ValueError, match="--task-weights"):
        train.task_weights("nonsense=1")


def test_validation_split_is_disjoint_from_test_and_training(train):
    ev = load_script("eval_tiny_dgemma.py")
    val = ev.validation_examples(3, tasks=get_suite("puzzles"))
    assert len(val) == 6
    assert all(split_of(ex.prompt) == "train" and is_validation(ex.prompt) for _, ex in val)


@pytest.mark.skipif(not (CHECKPOINT_DIR / "config.json").is_file(), reason="tiny-dgemma not shipped yet")
def test_shipped_checkpoint_loads_with_transformers_and_generates(tok):
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(CHECKPOINT_DIR)).eval()
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    assert model.generation_config.eos_token_id == EOS_ID and model.generation_config.pad_token_id == 0
    shipped_tok = TinyCharTokenizer.from_pretrained(CHECKPOINT_DIR)
    assert shipped_tok.get_vocab() == tok.get_vocab()
    ids = torch.tensor([shipped_tok.encode_prompt("copy: ana bo cyd")])
    torch.manual_seed(0)
    out = model.generate(ids)
    new = out.sequences[0, ids.shape[1]:]
    assert new.shape[0] % model.config.canvas_length == 0 and float(out.tokens_per_forward[0]) > 0
    assert isinstance(shipped_tok.decode(new), str)


def test_init_starts_from_a_checkpoints_weights_and_size(train, tok, tmp_path):
    """--init takes the folder's weights and model size (not the command's defaults) with a fresh
    optimizer; at a learning rate of 0 the saved weights are the folder's, to bfloat16 storage."""
    src = tmp_path / "src"
    model = _model(tok)
    model.save_pretrained(src)
    tok.save_pretrained(src)
    out = tmp_path / "run"
    train.main(["--init", str(src), "--out", str(out), "--max-minutes", "0.0001", "--batch-size", "2",
                "--lr", "0", "--eval-n", "0", "--threads", "1"])
    saved = DiffusionGemmaForBlockDiffusion.from_pretrained(str(out / "checkpoint"), dtype=torch.float32)
    assert saved.config.text_config.hidden_size == 32 and saved.config.canvas_length == 4
    for (name, p), q in zip(model.state_dict().items(), saved.state_dict().values()):
        torch.testing.assert_close(q, p.to(torch.bfloat16).float(), msg=name)
    with pytest.raises(SystemExit):  # --init and --resume together are refused (argparse error)
        train.main(["--init", str(src), "--resume", "--out", str(out)])
