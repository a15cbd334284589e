"Checks of taylor_calibrate.kda beyond the notebook's: one token, sequences independent within a batch, gradients through a padded chunk."
import torch, torch.nn.functional as F
from taylor_calibrate.kda import kda_recurrence_ref, chunk_kda_torch, kda_rule

def inputs(B=2, T=37, H=2, K=8, V=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (F.normalize(torch.randn(B, T, H, K, generator=g, dtype=torch.float64), dim=-1) for _ in range(2))
    return q, k, torch.randn(B, T, H, V, generator=g, dtype=torch.float64), -F.softplus(torch.randn(B, T, H, K, generator=g, dtype=torch.float64)), \
        torch.rand(B, T, H, generator=g, dtype=torch.float64)

def test_one_token():
    x = inputs(T=1)
    torch.testing.assert_close(chunk_kda_torch(*x)[0], kda_recurrence_ref(*x)[0])

def test_sequences_of_a_batch_are_independent():
    x = inputs(B=3)
    whole = chunk_kda_torch(*x, chunk_size=16)[0]
    for b in range(3):
        torch.testing.assert_close(chunk_kda_torch(*(t[b:b + 1] for t in x), chunk_size=16)[0], whole[b:b + 1])

def test_state_carries_across_calls():
    "Two calls, the second starting from the first's final state, equal one call over the whole sequence."
    x = inputs(T=40)
    o1, S1 = chunk_kda_torch(*(t[:, :25] for t in x), output_final_state=True, chunk_size=16)
    o2, _ = chunk_kda_torch(*(t[:, 25:] for t in x), initial_state=S1, chunk_size=16)
    torch.testing.assert_close(torch.cat([o1, o2], 1), kda_recurrence_ref(*x)[0])

def test_gradients_through_a_padded_chunk_are_finite_and_match():
    x = [t.requires_grad_() for t in inputs(T=21)]
    y = [t.detach().clone().requires_grad_() for t in x]
    ga = torch.autograd.grad(chunk_kda_torch(*x, chunk_size=16)[0].sum(), x)
    gb = torch.autograd.grad(kda_recurrence_ref(*y)[0].sum(), y)
    for a, b in zip(ga, gb):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)

def test_kda_rule_on_a_cpu_is_ours():
    x = inputs()
    torch.testing.assert_close(kda_rule(*x)[0], chunk_kda_torch(*x)[0], rtol=0, atol=0)

# ----- KDA layers through conversion, calibration, saving and generation -----
import math, pytest
from transformers import AutoModelForCausalLM
from taylor_calibrate.convert import random_teacher, to_hybrid, gdn_modules
from taylor_calibrate.kda import KimiDeltaAttention

def test_a_kda_hybrid_saves_loads_and_generates_exactly(tmp_path):
    "The saved config names the mixer; the loaded model is the same function; decoding with the cache equals full forwards."
    from conftest import saved_and_reloaded_generates_exactly
    h = to_hybrid(random_teacher('llama'), [0], mixer='kda')
    assert h.config.taylor_calibrate['mixer'] == 'kda' and all(isinstance(g, KimiDeltaAttention) for g in gdn_modules(h).values())
    saved_and_reloaded_generates_exactly(h, tmp_path/'h')

def test_unknown_mixer_is_one_line_before_any_compute():
    from taylor_calibrate.core import calibrate
    with pytest.raises(ValueError, match="unknown mixer 'mamba'; accepted: 'gdn', 'kda'"):
        calibrate(random_teacher('qwen2'), torch.zeros(10, dtype=torch.long), mixer='mamba')

def test_calibrate_gives_every_key_channel_its_heads_distance():
    "Phase 1 on KDA layers: dt_bias of every key channel of head h is b_dt(d_h), d_h as the statistics pass measures it."
    from dataclasses import replace
    from taylor_calibrate.core import calibrate, b_dt, get_recipe
    from taylor_calibrate.stats import attention_stats
    teacher = random_teacher('qwen3', layers=3)
    data = torch.randint(0, 96, (6 * 64,), generator=torch.Generator().manual_seed(1))
    recipe = replace(get_recipe('taylor_phase1'), exact_decay=False, calib_tokens=256, heldout_tokens=128)
    h = calibrate(teacher, data, keep=[0], init=recipe, seq_len=64, progress=False, mixer='kda')
    st = attention_stats(teacher, data[:256].view(4, 64), layers=[1, 2], progress=False)
    for l, kda in gdn_modules(h).items():
        want = b_dt(st.mean_distance[l].clamp_min(0.5))[:, None].expand(kda.num_heads, kda.head_k_dim)
        torch.testing.assert_close(kda.dt_bias.detach().view(kda.num_heads, -1).double(), want.double(), rtol=1e-4, atol=1e-4)
        assert st.mean_distance[l].std() > 0                                          # heads differ, so the test could fail
    rows = h.calibration_report.heads
    assert rows and all(math.isfinite(r['half_life']) and math.isfinite(r['beta']) for r in rows)

def test_pair_distances_reach_the_channels_when_given():
    "phase1 on a KDA layer with head_stats['pair_distance'] (how bench/kda_decay.py compares) sets each channel from its rotary pair."
    from taylor_calibrate.core import b_dt, get_recipe, phase1
    torch.manual_seed(0)
    kda = KimiDeltaAttention(hidden_size=32, num_heads=2, head_dim=8)
    x, mask = torch.randn(2, 16, 32), torch.ones(2, 16, dtype=torch.bool)
    pairs = torch.tensor([[2., 4., float('nan'), 8.], [16., 32., 64., 128.]])
    stats = dict(mean_distance=torch.tensor([5., 6.]), entropy=torch.tensor([1., 2.]), rel_entropy=torch.tensor([.3, .6]), pair_distance=pairs)
    phase1(kda, stats, x, torch.randn(2, 16, 2, 8), mask, get_recipe('taylor_phase1'))
    want = torch.tensor([[2., 4., 5., 8.] * 2, [16., 32., 64., 128.] * 2])
    torch.testing.assert_close(kda.dt_bias.detach().view(2, 8), b_dt(want).float())

def test_export_and_vllm_plugin_refuse_kda_layers_by_name():
    from taylor_calibrate.export import export_blockers
    from taylor_calibrate.vllm_plugin import hybrid_problems
    h = to_hybrid(random_teacher('qwen3'), [0], mixer='kda')
    assert export_blockers(h) == ["KDA layers (mixer 'kda'): the layout's linear attention is Gated DeltaNet, one decay per head"]
    assert hybrid_problems(h.config) == ["converted layers of mixer 'kda' (the plugin serves Gated DeltaNet layers, mixer 'gdn')"]

def test_distillation_trains_a_kda_hybrids_own_parameters():
    "distill takes a KDA hybrid as it takes a GDN one: the validation perplexity falls and KDA's decay and gate parameters move."
    from taylor_calibrate.distill import distill
    teacher = random_teacher('llama')
    h = to_hybrid(teacher, [0], mixer='kda')
    watched = {n: p.detach().clone() for n, p in h.named_parameters() if any(k in n for k in ('f_proj', 'g_proj', 'dt_bias'))}
    data = torch.randint(0, 96, (4096,), generator=torch.Generator().manual_seed(0))
    log = distill(h, teacher, data, tokens=1024, seq_len=64, batch_size=4, eval_data=data[:512], eval_tokens=512, progress=False)
    assert log.eval_ppl[-1] < log.eval_ppl[0]
    assert watched and all(not torch.equal(watched[n], p) for n, p in h.named_parameters() if n in watched)
