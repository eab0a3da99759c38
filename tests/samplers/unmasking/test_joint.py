"""The approximate joint sampler (ADJUST): layer refusal, hidden-state hook, training, shipped layers."""
from __future__ import annotations

import json

import pytest
import torch

import dlm
from dlm.oracles import HMMOracle, PermutationOracle
from dlm.tasks.oracle_tasks import get_oracle_suite
from joint_toy import toy_joint_layer, toy_joint_path, toy_joint_sampler
from samplers.unmasking.joint import JointSampler
from samplers.unmasking.joint_layer import (JointLayer, JointLayerMeta, load_layer, model_fingerprint,
                                            save_layer, shipped_layers)
from toy_models import ToyDLM

PROMPT = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])


def small_model(seed=0):
    """A random-weight tiny-dlm (hidden size 32): a real model that returns hidden states."""
    from dlm.tiny import TinyDLMConfig, TinyDLMModel

    torch.manual_seed(seed)
    cfg = TinyDLMConfig(vocab_size=58, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    return TinyDLMModel(cfg).eval()


def decode(model, sampler, steps=4, temperature=1.0, seed=0, prompt=PROMPT, **kw):
    g = torch.Generator().manual_seed(seed)
    kw.setdefault("gen_length", 16)
    kw.setdefault("block_length", 8)
    return dlm.generate(model, prompt, steps=steps, sampler=sampler, temperature=temperature, generator=g, **kw)


def test_fingerprint_tells_models_apart():
    assert model_fingerprint(ToyDLM(seed=0)) == model_fingerprint(ToyDLM(seed=0))
    assert model_fingerprint(ToyDLM(seed=0)) != model_fingerprint(ToyDLM(seed=1))
    assert model_fingerprint(PermutationOracle(5)) != model_fingerprint(PermutationOracle(6))
    assert model_fingerprint(HMMOracle.random(seed=0)) != model_fingerprint(HMMOracle.random(seed=1))


def test_fingerprint_is_cached_on_the_model_until_deleted():
    """As documented: hashing reads every weight once, then the cached value is returned (a weight
    changed in place keeps the old fingerprint) until `_dlm_fingerprint` is deleted."""
    model = ToyDLM(seed=0)
    before = model_fingerprint(model)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert model_fingerprint(model) == before
    del model._dlm_fingerprint
    assert model_fingerprint(model) != before


def test_layer_for_another_checkpoint_is_refused():
    sampler = toy_joint_sampler(ToyDLM(seed=0))
    with pytest.raises(ValueError, match="checkpoint hash.*dlm train-joint"):
        decode(ToyDLM(seed=1), sampler)


def test_layer_for_another_vocabulary_is_refused():
    sampler = toy_joint_sampler(ToyDLM(seed=0))
    with pytest.raises(ValueError, match="vocabulary of 16 tokens.*has 20"):
        decode(ToyDLM(vocab_size=20), sampler, prompt=torch.tensor([[1, 2, 3]]))


def test_layer_for_another_hidden_size_is_refused(tmp_path):
    model = small_model()
    meta = JointLayerMeta(vocab_size=58, feature_size=48, features="hidden",
                          model_fingerprint=model_fingerprint(model), width=16, heads=2, max_block=16)
    save_layer(JointLayer(meta), tmp_path / "j")
    with pytest.raises(ValueError, match="hidden states of size 48.*hidden_size=32"):
        decode(model, JointSampler(layer=str(tmp_path / "j")), prompt=torch.tensor([[3, 4, 5]]))


def test_joint_without_a_layer_names_the_fix():
    with pytest.raises(ValueError, match="no trained layer for this model.*dlm train-joint"):
        decode(ToyDLM(), "joint")
    with pytest.raises(FileNotFoundError, match="dlm train-joint"):
        JointSampler(layer="/nonexistent/joint-layer")
    with pytest.raises(ValueError, match="order"):
        JointSampler(order="sideways")


def test_layer_round_trips_through_files(tmp_path):
    layer = toy_joint_layer(ToyDLM())
    save_layer(layer, tmp_path / "x")
    again = load_layer(tmp_path / "x.json")
    assert again.meta == layer.meta
    for (name, a), (_, b) in zip(layer.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.filterwarnings("ignore:.*trained for order=random")  # the toy layer's order is beside the point
def test_confidence_order_left_padded_batch_matches_rows_alone():
    model = ToyDLM()
    sampler = lambda: toy_joint_sampler(model, order="confidence")  # noqa: E731
    pad = model.config.pad_token_id
    batch = torch.tensor([[pad, pad, pad, 3, 4, 5], [1, 2, 3, 4, 5, 6]])
    mask = (torch.arange(6) >= torch.tensor([[3], [0]])).long()
    together = decode(model, sampler(), prompt=batch, attention_mask=mask, temperature=0.0)
    alone = decode(model, sampler(), prompt=torch.tensor([[3, 4, 5]]), temperature=0.0)
    assert torch.equal(together.sequences[0, 3:], alone.sequences[0])


def test_layer_changes_what_is_drawn_but_not_the_first_token():
    """With k tokens per step the first is drawn from the model's marginal, the rest from the
    corrected distributions: a zero layer and a random layer agree on the step's first pick only."""
    model = ToyDLM()
    zero = toy_joint_layer(model)
    with torch.no_grad():
        zero.head.weight.zero_()
    from samplers.base import StepContext

    x = torch.full((1, 8), model.config.mask_token_id)
    logits = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(0))
    logits[..., model.config.mask_token_id] = float("-inf")
    outs = []
    for layer in (zero, toy_joint_layer(model)):
        s = JointSampler(order="confidence")
        s.layer, s._model_fingerprint = layer, layer.meta.model_fingerprint
        ctx = StepContext(x=x, candidates=torch.ones(1, 8, dtype=torch.bool), num_transfer=torch.tensor([8]),
                          step=0, steps_in_block=1, last_step=True, temperature=0.0, generator=None,
                          mask_token_id=model.config.mask_token_id)
        outs.append(s.step(logits, ctx).x)
    first = logits.softmax(-1).max(-1).values.argmax()
    assert outs[0][0, first] == outs[1][0, first] == logits[0, first].argmax()
    assert torch.equal(outs[0][0], logits[0].argmax(-1))  # zero correction: plain marginals
    assert not torch.equal(outs[0], outs[1])


def test_hidden_states_reach_the_layer(tmp_path):
    model = small_model()
    meta = JointLayerMeta(vocab_size=58, feature_size=32, features="hidden",
                          model_fingerprint=model_fingerprint(model), width=16, heads=2, max_block=8)
    layer = JointLayer(meta)
    with torch.no_grad():
        layer.head.weight.normal_(0, 1.0)
    save_layer(layer, tmp_path / "h")
    seen = []
    sampler = JointSampler(layer=str(tmp_path / "h"))
    step = sampler.step
    sampler.step = lambda logits, ctx: (seen.append(ctx.hidden), step(logits, ctx))[1]
    out = decode(model, sampler, prompt=torch.tensor([[3, 4, 5]]))
    assert out.nfe == 4 and len(seen) == 4
    assert all(h is not None and h.shape == (1, 8, 32) for h in seen)
    with pytest.raises(ValueError, match="kv_cache='none'"):
        decode(model, JointSampler(layer=str(tmp_path / "h")), prompt=torch.tensor([[3, 4, 5]]), kv_cache="prefix")


def test_training_smoke_and_cli(tmp_path):
    from dlm.cli import main
    from dlm.joint_training import TrainJointConfig, TrainingSource, train_joint_layer

    oracle = PermutationOracle(4)
    source = TrainingSource(oracle, oracle.prompt(4), None, 4, 4, oracle.config.mask_token_id, "perm4")
    layer = train_joint_layer(source, TrainJointConfig(steps=3, batch=8, chain=3, pool=16, width=16), log=lambda m: None)
    assert layer.meta.model_fingerprint == model_fingerprint(oracle)
    assert layer.meta.features == "logprobs" and layer.meta.training["steps"] == 3
    assert float(layer.head.weight.detach().abs().sum()) > 0  # the optimiser moved the zero-initialised head
    out = tmp_path / "cli-layer"
    assert main(["train-joint", "--model", "oracle-permutation", "--steps", "2", "--pool", "16",
                 "--batch", "4", "--width", "16", "--out", str(out)]) == 0
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["model_fingerprint"] == model_fingerprint(get_oracle_suite("oracle-permutation").build())
    assert main(["train-joint", "--model", "oracle-permutation", "--chain", "1", "--out", str(out)]) == 2


@pytest.mark.parametrize("suite", ["oracle-permutation", "oracle-hmm"])
def test_shipped_oracle_layers_fit_their_oracles(suite):
    layers = shipped_layers()
    assert suite in layers
    meta = json.loads(layers[suite].with_suffix(".json").read_text())
    assert meta["model_fingerprint"] == model_fingerprint(get_oracle_suite(suite).build())
    assert sum(p.numel() for p in load_layer(layers[suite]).parameters()) < 500_000


def test_shipped_tiny_dlm_layer_fits_the_shipped_checkpoint():
    model = dlm.load("tiny-dlm").model
    meta = json.loads(shipped_layers()["tiny-dlm"].with_suffix(".json").read_text())
    if meta["model_fingerprint"] != model_fingerprint(model):
        pytest.fail("the tiny-dlm checkpoint changed since its joint layer was trained: "
                    "re-train it with `dlm train-joint --model tiny-dlm`")


def _oracle_outputs(oracle, sampler, steps, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return dlm.generate(oracle, oracle.prompt(n), gen_length=oracle.gen_length, steps=steps, sampler=sampler,
                        temperature=1.0, generator=g).sequences


def test_shipped_permutation_layer_beats_marginal_sampling():
    """2 tokens per forward on permutations of 8: marginal sampling is valid 27.8% of the time in
    expectation, the shipped layer about 99.9% (docs/benchmarks.md); 256 seeded samples leave a
    wide margin on both sides of the thresholds."""
    oracle = get_oracle_suite("oracle-permutation").build()
    marginal = oracle.is_valid(_oracle_outputs(oracle, "random", 4, 256)).double().mean()
    joint = oracle.is_valid(_oracle_outputs(oracle, "joint", 4, 256)).double().mean()
    assert marginal < 0.45 and joint > 0.9


def test_shipped_hmm_layer_closes_the_likelihood_gap():
    """4 tokens per forward on the HMM language: marginal sampling's outputs are 0.75 nats less
    likely than exact samples, the shipped layer's 0.05 (2048 samples, docs/benchmarks.md)."""
    oracle = get_oracle_suite("oracle-hmm").build()
    expected, _ = oracle.expected_log_prob()
    marginal = expected - oracle.log_prob(_oracle_outputs(oracle, "random", 2, 512)).mean()
    joint = expected - oracle.log_prob(_oracle_outputs(oracle, "joint", 2, 512)).mean()
    assert marginal > 0.4 and joint < 0.25


# --- commit order of the layer's training (issue 33, part 5) -------------------------------------

def _perm_source(n=4):
    from dlm.joint_training import TrainingSource

    oracle = PermutationOracle(n)
    return TrainingSource(oracle, oracle.prompt(4), None, n, n, oracle.config.mask_token_id, f"perm{n}")


def test_confidence_chain_commits_the_most_confident_position():
    from dlm.joint_training import chain_commit

    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(3, 6, 9, generator=g)
    teacher[0, 4, 2] = 9.0  # the most confident position of row 0, but already committed
    teacher[0, 1, 7] = 6.0  # so this one wins
    remaining = torch.tensor([[1, 1, 1, 0, 0, 1], [1, 1, 1, 1, 1, 1], [0, 1, 0, 1, 0, 0]], dtype=torch.bool)
    live = torch.tensor([True, True, False])
    pick, token = chain_commit(teacher, remaining, live, "confidence", 0.0, g)
    confidence = teacher.softmax(-1).max(-1).values.masked_fill(~remaining, -1)
    assert torch.equal(pick.sum(1), torch.tensor([1, 1, 0]))
    assert int(pick[0].nonzero()) == 1
    assert int(pick[1].nonzero()) == int(confidence[1].argmax())
    assert torch.equal(token, teacher.argmax(-1))  # greedy at temperature 0
    # Random order commits one remaining position per live row, not necessarily the confident one.
    picks = {int(chain_commit(teacher, remaining, live, "random", 1.0, g)[0][1].nonzero()) for _ in range(40)}
    assert len(picks) > 1 and all(remaining[1, p] for p in picks)


def test_confidence_states_are_the_states_of_the_confidence_run():
    """The pool's commit ranks come from the confidence sampler's own run: rank 0 is the position it
    commits first on the fully masked block, and a state after n steps masks exactly ranks >= n."""
    from dlm.joint_training import commit_ranks, state_masks

    model = ToyDLM()
    out = decode(model, "confidence", steps=16, temperature=0.0, return_trace=True, eos_early_stop=False)
    ranks = commit_ranks(out.trace, 2, 16, 8, model.config.mask_token_id)
    for block in range(2):
        assert torch.equal(ranks[:, block * 8:(block + 1) * 8].sort(1).values, torch.arange(8).expand(2, 8))
    x = torch.cat([PROMPT, torch.full((2, 16), model.config.mask_token_id)], 1)
    logits = model(x).logits[:, 5:13].float()
    logits[..., model.config.mask_token_id] = float("-inf")
    assert torch.equal(ranks[:, :8].argmin(1), logits.softmax(-1).max(-1).values.argmax(1))
    masked = state_masks(ranks[:, :8], 2, 8, torch.Generator().manual_seed(3))
    done = 8 - masked.sum(1, keepdim=True)
    assert torch.equal(masked, ranks[:, :8] >= done) and bool((masked.sum(1) >= 2).all())


def test_order_is_recorded_and_old_files_read_as_random(tmp_path):
    from dlm.joint_training import TrainJointConfig, train_joint_layer

    layer = train_joint_layer(_perm_source(), TrainJointConfig(steps=2, batch=8, chain=3, pool=8, width=16,
                                                              order="confidence"), log=lambda m: None)
    assert layer.meta.order == "confidence"
    assert layer.meta.training["order"] == "confidence" and layer.meta.training["temperature"] == 0.0
    save_layer(layer, tmp_path / "c")
    assert json.loads((tmp_path / "c.json").read_text())["order"] == "confidence"
    assert load_layer(tmp_path / "c").meta.order == "confidence"
    old = json.loads((tmp_path / "c.json").read_text())
    del old["order"]  # a file written before the field existed
    (tmp_path / "c.json").write_text(json.dumps(old))
    assert load_layer(tmp_path / "c").meta.order == "random"
    with pytest.raises(ValueError, match="order"):
        TrainJointConfig(order="sideways").validate()
    with pytest.raises(ValueError, match="temperature"):
        TrainJointConfig(temperature=-1.0).validate()
    with pytest.raises(ValueError, match="focus"):
        TrainJointConfig(focus=1.5, order="confidence").validate()
    with pytest.raises(ValueError, match="focus needs order='confidence'"):
        TrainJointConfig(focus=0.5).validate()


def test_auto_layer_follows_the_order_and_a_mismatch_warns(tmp_path, monkeypatch):
    import dataclasses
    import warnings

    import samplers.unmasking.joint_layer as joint_layer

    model = ToyDLM()
    monkeypatch.setattr(joint_layer, "CHECKPOINT_DIR", tmp_path)
    random_layer = toy_joint_layer(model, seed=0)
    save_layer(random_layer, tmp_path / "joint-toy")
    with pytest.warns(UserWarning, match="trained for order=random, used with order=confidence.*--order confidence"):
        decode(model, JointSampler(order="confidence"), temperature=0.0)
    confidence_layer = toy_joint_layer(model, seed=1)
    confidence_layer.meta = dataclasses.replace(confidence_layer.meta, order="confidence")
    save_layer(confidence_layer, tmp_path / "joint-toy-confidence")  # sorts before joint-toy.json
    for order, want in (("random", random_layer), ("confidence", confidence_layer)):
        sampler = JointSampler(order=order)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            decode(model, sampler, temperature=0.0)
        assert sampler.layer.meta.order == order
        assert torch.equal(sampler.layer.head.weight, want.head.weight)
    with pytest.warns(UserWarning, match=f"joint layer {tmp_path / 'joint-toy'} .*order=random"):
        decode(model, JointSampler(order="confidence", layer=str(tmp_path / "joint-toy")), temperature=0.0)


@pytest.mark.parametrize("focus", [0.0, 0.75])
def test_training_lowers_the_kl_along_confidence_order(focus):
    """A few dozen steps on permutations of 4 (where committing a symbol changes every other
    position's conditional) cut the KL per confidence-order chain link well below marginal
    sampling's, measured on fresh states (random order learns too, but needs hundreds of steps)."""
    from dlm.joint_training import TrainJointConfig, evaluate_joint_layer, train_joint_layer

    source = _perm_source()
    config = TrainJointConfig(steps=40, batch=32, chain=3, pool=64, width=16, order="confidence", focus=focus)
    trained = train_joint_layer(source, config, log=lambda m: None)
    untrained = JointLayer(trained.meta)  # zero head: the model's marginals
    before = evaluate_joint_layer(source, untrained, config, batches=4)
    after = evaluate_joint_layer(source, trained, config, batches=4)
    assert before > 0.1 and after < 0.5 * before


def test_cli_order_confidence_writes_its_own_stem(tmp_path):
    from dlm.cli import main
    from dlm.commands.train_joint import default_out

    assert default_out("oracle-permutation").name == "joint-oracle-permutation"
    assert default_out("oracle-permutation", "confidence").name == "joint-oracle-permutation-confidence"
    out = tmp_path / "conf"
    assert main(["train-joint", "--model", "oracle-permutation", "--order", "confidence", "--steps", "2",
                 "--pool", "8", "--batch", "4", "--width", "16", "--out", str(out)]) == 0
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["order"] == "confidence" and meta["training"]["temperature"] == 0.0


def test_focus_scores_the_doubt_of_the_masks_a_chain_commits_next():
    from dlm.joint_training import chain_doubt

    logits = torch.full((3, 6, 4), -20.0)
    logits[:, :, 0] = 20.0  # every position certain ...
    logits[1, 2] = 0.0  # ... but row 1's position 2 (uniform: doubt 0.75)
    logits[2, 5] = 0.0  # ... and row 2's position 5
    masked = torch.tensor([[1, 1, 1, 0, 0, 0],   # only certain masks
                           [1, 1, 1, 0, 0, 0],   # three masks, one doubtful: within a chain of 3
                           [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    doubt = chain_doubt(logits, masked, chain=3)
    assert doubt[0] < 1e-6 and abs(float(doubt[1]) - 0.75) < 1e-4
    assert doubt[2] < 1e-6  # its doubtful mask comes after 5 certain ones: beyond a chain of 3
    assert abs(float(chain_doubt(logits, masked, chain=6)[2]) - 0.75) < 1e-4
