"Mamba2 layers through conversion, calibration, saving, generation and distillation: each converted layer is the Mamba2 recurrence on the teacher's own projections."
import math, pytest, torch, torch.nn.functional as F
from transformers import AutoModelForCausalLM
from taylor_calibrate.convert import random_teacher, to_hybrid, gdn_modules, repeat_kv_heads, decoder_layers
from taylor_calibrate.mamba2 import Mamba2Layer, mamba2_recurrence_ref

def reference(layer, attn, h):
    "A converted layer's output written from Mamba2's definition, in float64: x, B, C = silu of the teacher's v, k, q (q/k norm weights folded, KV heads repeated), then w * RMSNorm(y silu(z)) per head and W_O."
    b, T, _ = h.shape
    H, d = layer.num_heads, layer.head_dim
    Hkv = attn.k_proj.out_features // d
    def proj(p):
        lin = getattr(attn, p)
        t = F.linear(h.double(), lin.weight.double(), None if lin.bias is None else lin.bias.double()).view(b, T, -1, d)
        if (norm := getattr(attn, p[0] + '_norm', None)) is not None and p != 'v_proj': t = t * norm.weight.double()
        return t if p == 'q_proj' else t.repeat_interleave(H // Hkv, 2)
    q, k, v = (F.silu(proj(p)) for p in ('q_proj', 'k_proj', 'v_proj'))
    zx = F.linear(h.double(), layer.in_proj.weight.double())
    z, dt = zx[..., :H * d], F.softplus(zx[..., -H:] + layer.dt_bias.double())
    y, _ = mamba2_recurrence_ref(v, dt, -layer.A_log.double().exp(), k, q, layer.D)
    u = y * F.silu(z).view(b, T, H, d)
    u = u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + layer.norm_eps) * layer.norm.weight.double().view(H, d)
    return F.linear(u.flatten(2), attn.o_proj.weight.double())

@pytest.mark.parametrize('kind', ['qwen2', 'llama', 'mistral', 'qwen3'])
def test_every_converted_layer_is_the_recurrence_on_the_teachers_projections(kind):
    "After conversion and after Phase 1 (step, D, gate, amplitude changed), each layer equals the float64 recurrence from the definition."
    from taylor_calibrate.core import calibrate
    teacher = random_teacher(kind, layers=3)
    data = torch.randint(0, 96, (6, 64), generator=torch.Generator().manual_seed(0))
    hybrids = [to_hybrid(teacher, [0], mixer='mamba2'),
               calibrate(teacher, data, keep=[0], init='taylor_phase1', seq_len=64, calib_tokens=256, heldout_tokens=128, progress=False, mixer='mamba2')]
    h = torch.randn(2, 29, 64, generator=torch.Generator().manual_seed(1))
    for hybrid in hybrids:
        for l, layer in gdn_modules(hybrid).items():
            assert isinstance(layer, Mamba2Layer) and layer.n_groups == layer.num_heads and layer.state_size == layer.head_dim
            with torch.no_grad():
                torch.testing.assert_close(layer(h)[0].double(), reference(layer, decoder_layers(teacher)[l].self_attn, h), rtol=1e-4, atol=1e-5)

def test_phase1_reaches_its_targets_and_beats_the_copy():
    "Half-life d_h and step beta* per head as the statistics pass measures them; D = 0; each layer's held-out error far below the naive copy's."
    from dataclasses import replace
    from taylor_calibrate.core import calibrate, get_recipe, concentration, beta_star
    from taylor_calibrate.stats import attention_stats
    teacher = random_teacher('qwen3', layers=3)
    data = torch.randint(0, 96, (6 * 64,), generator=torch.Generator().manual_seed(1))
    kw = dict(keep=[0], seq_len=64, progress=False, mixer='mamba2', calib_tokens=256, heldout_tokens=128)
    h = calibrate(teacher, data, init='taylor_phase1', **kw)
    naive = calibrate(teacher, data, init='naive', **kw).calibration_report
    st = attention_stats(teacher, data[:256].view(4, 64), layers=[1, 2], progress=False)
    x = torch.randn(2, 16, 64)
    for l, layer in gdn_modules(h).items():
        beta = beta_star(concentration(st.entropy[l], st.rel_entropy[l]))
        dt, g = layer.gates(x)
        torch.testing.assert_close(dt[0, 0].double(), beta.double(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close((math.log(2) / -g[0, 0]).double(), st.mean_distance[l].clamp_min(0.5).double(), rtol=1e-3, atol=1e-3)
        assert torch.equal(layer.D.detach(), torch.zeros_like(layer.D))
        assert st.mean_distance[l].std() > 0                                          # heads differ, so the test could fail
    rep = h.calibration_report
    assert all(a['mse_phase1'] < 0.1 * b['mse_copy'] for a, b in zip(rep.layers, naive.layers)), (rep.layers, naive.layers)
    assert rep.heads and all(math.isfinite(r['half_life']) and math.isfinite(r['beta']) for r in rep.heads)

def test_zero_gate_silences_mamba2_layers_exactly():
    from taylor_calibrate.core import calibrate
    teacher = random_teacher('llama', layers=3)
    data = torch.randint(0, 96, (6, 64), generator=torch.Generator().manual_seed(0))
    h = calibrate(teacher, data, keep=[0], init='zero_gate', seq_len=64, calib_tokens=256, heldout_tokens=128, progress=False, mixer='mamba2')
    for layer in gdn_modules(h).values():
        assert layer(torch.randn(1, 9, 64))[0].abs().max().item() == 0.

def test_a_mamba2_hybrid_saves_loads_and_generates_exactly(tmp_path):
    "The saved config names the mixer; the loaded model is the same function; decoding with the cache equals full forwards; the state's bytes are as `gdn_state_bytes` says."
    from conftest import saved_and_reloaded_generates_exactly
    from taylor_calibrate.cache import cache_bytes, measured_cache_bytes
    from transformers import DynamicCache
    h = to_hybrid(random_teacher('qwen2'), [0], mixer='mamba2')
    assert h.config.taylor_calibrate['mixer'] == 'mamba2'
    h2 = saved_and_reloaded_generates_exactly(h, tmp_path/'h')
    cache = DynamicCache(config=h2.config)
    with torch.no_grad(): h2(torch.randint(0, 96, (2, 21)), cache=cache, use_cache=True)
    assert measured_cache_bytes(cache)['gdn'] == cache_bytes(h2.config, 21, batch_size=2)['gdn']

def test_export_and_vllm_plugin_refuse_mamba2_layers_by_name():
    from taylor_calibrate.export import export_blockers
    from taylor_calibrate.vllm_plugin import hybrid_problems
    h = to_hybrid(random_teacher('qwen3'), [0], mixer='mamba2')
    assert export_blockers(h, 'qwen3_5')[0].startswith("MAMBA2 layers (mixer 'mamba2')")
    assert hybrid_problems(h.config) == ["converted layers of mixer 'mamba2' (the plugin serves Gated DeltaNet layers, mixer 'gdn')"]

def test_phase2_and_distillation_train_a_mamba2_hybrid():
    "Phase 2 lowers each layer's held-out error below Phase 1's; distill lowers the validation perplexity and moves in_proj, dt_bias, A_log and norm.weight."
    from taylor_calibrate.core import calibrate
    from taylor_calibrate.distill import distill
    teacher = random_teacher('llama')
    data = torch.randint(0, 96, (4096,), generator=torch.Generator().manual_seed(0))
    h = calibrate(teacher, data, keep=[0], init='taylor', seq_len=64, calib_tokens=256, heldout_tokens=128, steps=20, progress=False, mixer='mamba2')
    assert all(l['mse_phase2'] < l['mse_phase1'] for l in h.calibration_report.layers), h.calibration_report.layers
    watched = {n: p.detach().clone() for n, p in h.named_parameters() if any(k in n for k in ('in_proj', 'dt_bias', 'A_log', 'norm.weight')) and 'gdn' in n}
    log = distill(h, teacher, data, tokens=1024, seq_len=64, batch_size=4, eval_data=data[:512], eval_tokens=512, progress=False)
    assert log.eval_ppl[-1] < log.eval_ppl[0]
    assert watched and all(not torch.equal(watched[n], p) for n, p in h.named_parameters() if n in watched)
