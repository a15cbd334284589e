import sys
from pathlib import Path
import pytest, torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/'scripts'))

@pytest.fixture
def root(): return ROOT


def with_dynamics(hybrid, seed=1):
    "Set a hybrid's GDN dynamics and gate away from their defaults, as calibration does (a loaded default would hide re-initialisation)."
    from taylor_calibrate.convert import gdn_modules
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in gdn_modules(hybrid).values():
            m.A_log.copy_(torch.empty_like(m.A_log).uniform_(-3, 0, generator=g)); m.dt_bias.copy_(torch.randn(m.dt_bias.shape, generator=g))
            m.b_proj.weight.copy_(0.2 * torch.randn(m.b_proj.weight.shape, generator=g)); m.g_proj.weight.mul_(0.1)
    return hybrid
