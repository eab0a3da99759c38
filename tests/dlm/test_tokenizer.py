import pytest

from dlm.tiny.tokenizer import CHARACTERS, TinyCharTokenizer


@pytest.fixture()
def tok():
    return TinyCharTokenizer()


def test_special_ids(tok):
    assert (tok.pad_token_id, tok.mask_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.mask_token_id != tok.pad_token_id
    assert tok.vocab_size == 3 + len(CHARACTERS)


def test_round_trip(tok):
    text = "sudoku: 1.3. .4.. ..1. 3...\n3+5=8. 8-2=6. #### 6 (a|b)'c?;*/_!"
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert all(i >= 3 for i in ids)
    assert tok.decode(ids) == text
    assert tok.encode(text, add_special_tokens=True) == ids


def test_decode_skips_special(tok):
    ids = tok.encode("ab") + [tok.eos_token_id, tok.mask_token_id, tok.pad_token_id]
    assert tok.decode(ids) == "ab"
    assert tok.decode(ids, skip_special_tokens=False) == "ab<eos><mask><pad>"
    assert tok.batch_decode([ids, tok.encode("c")]) == ["ab", "c"]


def test_decode_tensor(tok):
    torch = pytest.importorskip("torch")
    assert tok.batch_decode(torch.tensor([tok.encode("hi")])) == ["hi"]


@pytest.mark.parametrize("bad", ["Hello", "a\tb", "é", "<mask>"])
def test_unknown_character_raises(tok, bad):
    with pytest.raises(ValueError) as e:
        tok.encode(bad)
    assert "not in the tiny-dlm alphabet" in str(e.value)


def test_out_of_range_id(tok):
    with pytest.raises(ValueError):
        tok.decode([tok.vocab_size])


def test_save_load(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    tok2 = TinyCharTokenizer.from_pretrained(tmp_path)
    assert tok2.get_vocab() == tok.get_vocab()
    assert tok2.mask_token_id == tok.mask_token_id


def test_from_pretrained_missing(tmp_path):
    with pytest.raises(FileNotFoundError):
        TinyCharTokenizer.from_pretrained(tmp_path)


def test_pad_batch(tok):
    ids, att = tok.pad_batch([[5, 6, 7], [8]])
    assert ids == [[5, 6, 7], [0, 0, 8]]
    assert att == [[1, 1, 1], [0, 0, 1]]


def test_whole_words_round_trip_and_keep_character_ids():
    from dlm.tiny.tokenizer import TinyCharTokenizer
    plain, worded = TinyCharTokenizer(), TinyCharTokenizer(words=["copy", "ana", "bo"])
    text = "copy: ana bob bo anna\n3+5=8."
    ids = worded.encode(text)
    assert worded.decode(ids) == text
    assert len(ids) < len(plain.encode(text))
    assert worded.encode("bob") == plain.encode("bob")  # unknown words are spelled out
    assert worded.encode("ana") == [worded.vocab_size - 2]  # one token, after all characters


def test_word_vocabulary_is_saved(tmp_path):
    from dlm.tiny.tokenizer import TinyCharTokenizer
    TinyCharTokenizer(words=["tom", "kai"]).save_pretrained(tmp_path)
    assert TinyCharTokenizer.from_pretrained(tmp_path).words == ("tom", "kai")


@pytest.mark.parametrize("words", [["a"], ["Tom"], ["tom", "tom"], ["to m"]])
def test_bad_word_lists_are_refused(words):
    from dlm.tiny.tokenizer import TinyCharTokenizer
    with pytest.raises(ValueError, match="words"):
        TinyCharTokenizer(words=words)
