"""dlm.load on checkpoints we build: the tiny model saved to disk, a tiny random BERT masked LM,
and a tiny random GPT-2 (a causal LM, which must be refused)."""
from __future__ import annotations

import pytest
import torch
from transformers import (BertConfig, BertForMaskedLM, BertTokenizer, GPT2Config, GPT2LMHeadModel,
                          PreTrainedTokenizerFast)

import dlm
from dlm.tiny import TinyCharTokenizer, TinyDLMConfig, TinyDLMModel

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a"]


def test_tiny_checkpoint_directory_loads_through_auto_classes(tmp_path):
    tok = TinyCharTokenizer()
    model = TinyDLMModel(TinyDLMConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=64))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = dlm.load(str(tmp_path))
    assert loaded.mask_token_id == tok.mask_token_id and loaded.pad_token_id != loaded.mask_token_id
    assert not loaded.shift_logits
    out = dlm.DLMPipeline.from_pretrained(str(tmp_path))("copy: ana bo", num_inference_steps=4, gen_length=8)
    assert out.nfe == 4 and len(out.texts) == 1


def test_bert_masked_lm_decodes_in_parallel(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer(str(tmp_path / "vocab.txt")).save_pretrained(tmp_path)
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=64)).save_pretrained(tmp_path)
    loaded = dlm.load(str(tmp_path))
    assert loaded.mask_token_id == 4
    model, tokenizer = loaded
    ids = torch.tensor([tokenizer.encode("the cat sat", add_special_tokens=False)])
    out = dlm.generate(model, ids, gen_length=8, block_length=4, steps=4, mask_token_id=loaded.mask_token_id)
    assert out.nfe == 4 and not (out.sequences == 4).any()


def test_causal_lm_without_mask_token_is_refused(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", "<eos>"] + WORDS)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="<eos>").save_pretrained(tmp_path)
    GPT2LMHeadModel(GPT2Config(vocab_size=10, n_embd=16, n_layer=1, n_head=2, n_positions=32)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not a masked diffusion LM: a causal LM"):
        dlm.load(str(tmp_path))


@pytest.mark.parametrize("name,match", [("", "empty"), ("no-such-model", "unknown model"),
                                        ("./missing/dir", "unknown model")])
def test_unknown_models_are_refused(name, match):
    with pytest.raises(ValueError, match=match):
        dlm.load(name)
