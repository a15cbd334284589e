import sys
from pathlib import Path
import pytest, torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/'scripts'))

@pytest.fixture
def root(): return ROOT

@pytest.fixture(autouse=True)
def in_an_empty_folder(tmp_path_factory, monkeypatch):
    """Every test runs in a new empty working folder, and so do the commands it starts: none reads or writes the folder pytest
    was started in, where README's commands leave their output (the demo's taylor-calibrate-demo/ in the clone's root).
    Files of the repository are read through ROOT."""
    monkeypatch.chdir(tmp_path_factory.mktemp('cwd'))


def with_dynamics(hybrid, seed=1):
    "Set a hybrid's GDN dynamics and gate away from their defaults, as calibration does (a loaded default would hide re-initialisation)."
    from taylor_calibrate.convert import gdn_modules
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in gdn_modules(hybrid).values():
            m.A_log.copy_(torch.empty_like(m.A_log).uniform_(-3, 0, generator=g)); m.dt_bias.copy_(torch.randn(m.dt_bias.shape, generator=g))
            m.b_proj.weight.copy_(0.2 * torch.randn(m.b_proj.weight.shape, generator=g)); m.g_proj.weight.mul_(0.1)
    return hybrid

def saved_and_reloaded_generates_exactly(hybrid, path, vocab: int = 96):
    "Save `hybrid` with save_hybrid, load it with AutoModelForCausalLM: assert the same logits bitwise and that cached greedy decoding equals argmax of full forwards; return the loaded model."
    from transformers import AutoModelForCausalLM
    from taylor_calibrate.hybrid import save_hybrid
    save_hybrid(hybrid, path)
    loaded = AutoModelForCausalLM.from_pretrained(path)
    ids = torch.randint(0, vocab, (2, 21), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, hybrid(ids).logits, rtol=0, atol=0)
        out = loaded.generate(ids[:, :9], max_new_tokens=8, do_sample=False)
        for t in range(9, 17):   # every generated token is the argmax of a forward over the whole prefix, no cache
            assert torch.equal(out[:, t], loaded(out[:, :t], use_cache=False).logits[:, -1].argmax(-1))
    return loaded
