"Our GatedDeltaNet against flash-linear-attention: same parameter names and shapes, same gate formula, same recurrence."
import warnings
import pytest
import torch
from taylor_calibrate.gdn import GatedDeltaNet, gdn_gates, chunk_gated_delta_rule_torch, l2norm

fla_layers = pytest.importorskip('fla.layers')   # importing fla's layers needs the triton package

CONFIGS = [dict(), dict(use_short_conv=True), dict(use_gate=False), dict(expand_v=2.0), dict(allow_neg_eigval=True),
           dict(use_short_conv=True, conv_size=3, use_gate=False)]

def _pair(cfg, hidden=64, heads=4, head_dim=16):
    ours = GatedDeltaNet(hidden_size=hidden, num_heads=heads, head_dim=head_dim, **cfg)
    fla_cfg = dict(expand_v=1.0, use_short_conv=False) | cfg          # fla's defaults differ: expand_v=2, short conv on
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        theirs = fla_layers.GatedDeltaNet(hidden_size=hidden, num_heads=heads, head_dim=head_dim, **fla_cfg)
    return ours, theirs

@pytest.mark.parametrize('cfg', CONFIGS, ids=lambda c: ','.join(f'{k}={v}' for k, v in c.items()) or 'default')
def test_same_parameter_names_and_shapes(cfg):
    ours, theirs = _pair(cfg)
    shapes = lambda m: {n: tuple(t.shape) for n, t in m.state_dict().items()}
    assert shapes(ours) == shapes(theirs)
    ours.load_state_dict(theirs.state_dict())                    # a state dict moves both ways without renaming
    theirs.load_state_dict(ours.state_dict())

def test_qkv_bias_only_adds_projection_biases():
    ours = GatedDeltaNet(hidden_size=64, num_heads=4, head_dim=16, qkv_bias=True)
    _, theirs = _pair({})
    extra = set(ours.state_dict()) - set(theirs.state_dict())
    assert extra == {'q_proj.bias', 'k_proj.bias', 'v_proj.bias'} and set(theirs.state_dict()) <= set(ours.state_dict())

def test_gates_match_fla():
    from fla.ops.gated_delta_rule.gate import naive_gdn_gate
    a, b, A_log, dt_bias = torch.randn(2, 7, 4), torch.randn(2, 7, 4), torch.randn(4), torch.randn(4)
    beta, g = gdn_gates(a, b, A_log, dt_bias)
    torch.testing.assert_close(g, naive_gdn_gate(a, A_log, dt_bias))
    torch.testing.assert_close(beta, torch.sigmoid(b))

def test_kernel_matches_fla_naive_chunk():
    from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule
    torch.manual_seed(0)
    B, T, H, K, V = 2, 150, 3, 32, 16
    q, k = l2norm(torch.randn(B, T, H, K)), l2norm(torch.randn(B, T, H, K))
    v, g, beta = torch.randn(B, T, H, V), -torch.rand(B, T, H), torch.rand(B, T, H)
    S0 = torch.randn(B, H, K, V) * 0.1
    kw = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=S0, output_final_state=True)   # by keyword: fla's orders differ
    o, S = chunk_gated_delta_rule_torch(**kw)
    ro, rS = naive_chunk_gated_delta_rule(**kw)
    torch.testing.assert_close(o, ro, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(S, rS, atol=1e-5, rtol=1e-4)
