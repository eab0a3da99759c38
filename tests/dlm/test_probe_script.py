"""scripts/probe_tiny_dlm_arithmetic.py: the probe hides every later step and scores exact digits."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from dlm.tasks import get_suite
from dlm.tiny import load_tiny_dlm
from tests.script_loader import load_script

probe_script = load_script("probe_tiny_dlm_arithmetic.py")


class _Recorder(torch.nn.Module):
    """Returns logits whose argmax is the clean token of every position it is told (an oracle that
    copies the answer), and records the ids it was fed."""

    def __init__(self, clean: list[int], mask_id: int, vocab: int) -> None:
        super().__init__()
        self.clean, self.seen = clean, []
        self.config = SimpleNamespace(mask_token_id=mask_id, eos_token_id=2)
        self.vocab = vocab

    def forward(self, x):
        self.seen.append(x.clone())
        logits = torch.zeros(1, x.shape[1], self.vocab)
        logits[0, torch.arange(x.shape[1]), torch.tensor(self.clean)] = 1.0
        return SimpleNamespace(logits=logits)


def test_result_and_everything_after_it_are_masked():
    _, tok = load_tiny_dlm()
    prompt, answer = tok.encode_prompt("ann has 3 figs. she gets 5. she loses 2. how many?"), tok.encode("3+5=8. 8-2=6. #### 6")
    start = "3+5=8. 8-2=6. #### 6".index("=") + 1
    model = _Recorder(prompt + answer, mask_id=1, vocab=len(tok))
    ids = probe_script.predict_result(model, prompt, answer, start, start + 1)
    fed = model.seen[0][0]
    assert (fed[len(prompt) + start:] == 1).all()  # the result and the later step that repeats it
    assert torch.equal(fed[:len(prompt) + start], torch.tensor(prompt + answer[:start]))
    assert tok.decode(ids) == "8"


def test_shipped_model_probe_counts_every_step():
    model, tok = load_tiny_dlm()
    out = probe_script.probe(model, tok, n=5)
    task_steps = sum(len(probe_script.STEP.findall(ex.answer)) for ex in get_suite("arithmetic")[0].examples("test", 5))
    ops = [row for key, row in out.items() if key in ("+", "-", "*")]
    assert sum(row["steps"] for row in ops) == task_steps
    assert all(0 <= row["right"] <= row["steps"] for row in ops)
