"""Corrupt and mismatched checkpoints, one kind per case: `dlm.load` raises one ValueError that names
the file and what is wrong; `dlm sample --model DIR` prints one line and exits 2 (no traceback)."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertTokenizer, RobertaConfig, RobertaForMaskedLM

import dlm
from dlm.cli import main
from dlm.tiny import TinyCharTokenizer, TinyDLMConfig, TinyDLMModel

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a"]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A whole tiny-dlm checkpoint folder (random weights) that loads."""
    path = tmp_path_factory.mktemp("good")
    tok = TinyCharTokenizer()
    torch.manual_seed(0)
    TinyDLMModel(TinyDLMConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _truncate(path, keep):
    f = path / "model.safetensors"
    os.truncate(f, keep(f.stat().st_size))


def _config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _shards(path):
    (path / "model.safetensors").unlink()
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"embed.weight": "model-00001-of-00002.safetensors"}}))


DAMAGE = {  # name: (what to do to a good folder, file named in the message, words of the message)
    "weights cut in half": (lambda p: _truncate(p, lambda n: n // 2), "model.safetensors", "truncated"),
    "weights cut in the header": (lambda p: _truncate(p, lambda n: 20), "model.safetensors", "header length"),
    "weights of 3 bytes": (lambda p: _truncate(p, lambda n: 3), "model.safetensors", "too short"),
    "weights overwritten with noise": (lambda p: (p / "model.safetensors").write_bytes(os.urandom(4096)),
                                       "model.safetensors", "truncated or corrupt"),
    "bytes appended to weights": (lambda p: (p / "model.safetensors").open("ab").write(b"\0" * 64),
                                  "model.safetensors", "more than its header"),
    "weights missing": (lambda p: (p / "model.safetensors").unlink(), "", "no weights"),
    "shard missing": (_shards, "model-00001-of-00002.safetensors", "missing"),
    "config missing": (lambda p: (p / "config.json").unlink(), "config.json", "missing"),
    "config not JSON": (lambda p: (p / "config.json").write_text('{"model_type": "tiny-dlm", '), "config.json",
                        "not valid JSON"),
    "config of a diffusers model": (lambda p: (p / "config.json").write_text(json.dumps(
        {"_class_name": "UNet2DConditionModel", "sample_size": 8})), "config.json", "diffusers UNet2DConditionModel"),
    "config of an unknown family": (lambda p: _config(p, model_type="no-such-family"), "config.json", "no-such-family"),
    "config of another size": (lambda p: _config(p, intermediate_size=96), "", "shapes do not match its config.json"),
    "tokenizer missing": (lambda p: (p / "tokenizer.json").unlink(), "tokenizer.json", "no tokenizer files"),
    "tokenizer of a bigger vocabulary": (lambda p: TinyCharTokenizer(words=WORDS[:5]).save_pretrained(p), "tokenizer.json",
                                         "vocabulary"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_checkpoint_is_one_value_error_naming_the_file(good, tmp_path, kind, capsys):
    damage, file, words = DAMAGE[kind]
    path = tmp_path / "ckpt"
    shutil.copytree(good, path)
    dlm.load(str(path))  # whole, it loads
    damage(path)
    with pytest.raises(ValueError, match=words) as err:
        dlm.load(str(path))
    assert str(path / file).rstrip("/") in str(err.value)
    capsys.readouterr()
    assert main(["sample", "--model", str(path), "--gen-length", "8"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlm sample: error:") and words in lines[0], lines


def _bert_folder(path, vocab):
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer(str(path / "vocab.txt")).save_pretrained(path)


def test_bert_config_over_weights_of_another_family_is_refused(tmp_path):
    """A BERT config.json beside RoBERTa weights: transformers would start every BERT parameter at
    random and warn in a log; we refuse."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    _bert_folder(tmp_path, vocab)
    RobertaForMaskedLM(RobertaConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)).save_pretrained(tmp_path)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    cfg.architectures = ["BertForMaskedLM"]
    cfg.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="do not fit the 'bert' architecture.*have no weights") as err:
        dlm.load(str(tmp_path))
    assert str(tmp_path) in str(err.value)


def test_bert_tokenizer_bigger_than_the_embedding_is_refused(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    _bert_folder(tmp_path, vocab + ["extra1", "extra2"])
    BertForMaskedLM(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=64)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"has {len(vocab) + 2} tokens but the model's vocabulary"):
        dlm.load(str(tmp_path))


def test_bench_on_a_truncated_checkpoint_is_one_line(good, tmp_path, capsys):
    path = tmp_path / "ckpt"
    shutil.copytree(good, path)
    _truncate(path, lambda n: n - 100)
    assert main(["bench", "--model", str(path), "--suite", "copy", "--limit", "1", "--steps", "4",
                 "--gen-length", "8", "--block-length", "8", "--out", str(tmp_path / "out"), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.safetensors: truncated" in err[0]
