"Export of Mamba2 hybrids to transformers' native granitemoehybrid: loaded in a fresh interpreter without taylor_calibrate, the export gives the hybrid's logits and greedy tokens for Llama, Qwen2 and Mistral teachers; what the layout cannot represent is refused in one line, before anything is written."
import json, math
import pytest, torch
from taylor_calibrate.convert import gdn_modules, random_teacher, to_hybrid
from taylor_calibrate.export import check_export, export_blockers, export_hybrid, to_native

torch.set_num_threads(1)
X = torch.randint(0, 96, (2, 80), generator=torch.Generator().manual_seed(1))   # 80 tokens: across a 64-token chunk boundary

def perturbed(hybrid, seed=0):
    "Every Mamba2 parameter the weight copy sets to a constant (or leaves at its init), drawn at random: dynamics, skip, gate, norm, convolution."
    g = torch.Generator().manual_seed(seed)
    r = lambda t, std: std * torch.randn(t.shape, generator=g)
    with torch.no_grad():
        for m in gdn_modules(hybrid).values():
            m.A_log.copy_(torch.empty_like(m.A_log).uniform_(-3, 1, generator=g)); m.dt_bias.copy_(r(m.dt_bias, 1.0))
            m.D.copy_(r(m.D, 1.0)); m.norm.weight.copy_(torch.empty_like(m.norm.weight).uniform_(0.5, 1.5, generator=g))
            m.conv1d.weight.copy_(r(m.conv1d.weight, 0.5)); m.conv1d.bias.add_(r(m.conv1d.bias, 0.2))
            W = m.in_proj.weight
            W[:m.intermediate].copy_(r(W[:m.intermediate], 0.2)); W[-m.num_heads:].copy_(r(W[-m.num_heads:], 0.2))   # z and dt rows
    return hybrid

def exported(hybrid, path):
    export_hybrid(hybrid, path, layout='granitemoehybrid')
    return json.loads((path/'config.json').read_text()), check_export(hybrid, path, X)

CASES = {'llama': ({}, [0]),                                   # llama3 rope scaling, untied
         'qwen2': (dict(tie_word_embeddings=True), [1, 3]),    # q/k/v biases in kept and converted layers, tied head
         'mistral': ({}, [0, 2])}

@pytest.mark.parametrize('kind', CASES)
def test_export_is_the_hybrid(kind, tmp_path):
    kw, keep = CASES[kind]
    h = perturbed(to_hybrid(random_teacher(kind, **kw), keep, mixer='mamba2'))
    assert export_blockers(h, 'granitemoehybrid') == []
    cfg, res = exported(h, tmp_path/'native')
    assert (cfg['model_type'], cfg['architectures'], res['model_class']) == ('granitemoehybrid', ['GraniteMoeHybridForCausalLM'], 'GraniteMoeHybridForCausalLM')
    assert cfg['layer_types'] == ['attention' if i in keep else 'mamba' for i in range(4)]
    assert cfg['embedding_multiplier'] == cfg['residual_multiplier'] == pytest.approx(math.sqrt(10), abs=1e-12)   # eps 1e-5 against 1e-6
    assert (cfg['num_local_experts'], cfg['num_experts_per_tok'], cfg['mamba_expand'], cfg['attention_bias'], cfg['tie_word_embeddings']) == \
        (0, 0, 1, kind == 'qwen2', kind == 'qwen2')
    assert res['imported'] == [] and res['same_tokens'], res
    assert res['max_abs_diff'] < 1e-5, res
    assert [l.split(':')[0] for l in res['engine_problems']] == ['llama.cpp', 'llama.cpp']   # Mamba2 width 1 x hidden_size, RoPE

def test_a_calibrated_hybrid_exports_exactly(tmp_path):
    from taylor_calibrate.core import calibrate
    data = torch.randint(0, 96, (6, 64), generator=torch.Generator().manual_seed(0))
    h = calibrate(random_teacher('llama', layers=3), data, keep=[0], init='phase1', seq_len=64, calib_tokens=256, heldout_tokens=128,
                  progress=False, mixer='mamba2')
    assert h.config.taylor_calibrate['mixer'] == 'mamba2' and not any(torch.equal(m.D, torch.ones_like(m.D)) for m in gdn_modules(h).values())
    cfg, res = exported(h, tmp_path/'native')
    assert cfg['layer_types'] == ['attention', 'mamba', 'mamba'] and res['same_tokens'] and res['max_abs_diff'] < 1e-5, res

def test_without_the_residual_scale_the_norms_differ():
    "A negative control for the tolerance: the eps reconciliation matters far above it (the export's multipliers set back to 1)."
    h = perturbed(to_hybrid(random_teacher('llama'), [0], mixer='mamba2'))
    native = to_native(h, 'granitemoehybrid')
    with torch.no_grad():
        ref = h(X).logits
        assert (native(X).logits - ref).abs().max() < 1e-5
        native.model.embedding_multiplier = 1.0
        for layer in native.model.layers: layer.residual_multiplier = 1.0
        assert (native(X).logits - ref).abs().max() > 1e-3

def test_blockers_are_named_in_one_line_before_anything_is_written(tmp_path):
    q3 = to_hybrid(random_teacher('qwen3'), [0], mixer='mamba2')
    assert export_blockers(q3, 'granitemoehybrid') == ['q/k norms in kept layers']
    gdn = to_hybrid(random_teacher('llama'), [0])
    assert export_blockers(gdn, 'granitemoehybrid') == ["GDN layers (mixer 'gdn'): the layout's linear layers are Mamba2, one decay per head set by the step"]
    assert export_blockers(q3, 'qwen3_5') == ["MAMBA2 layers (mixer 'mamba2'): the layout's linear attention is Gated DeltaNet, one decay per head"]
    assert export_blockers(gdn, 'qwen3_5') == ['no q/k norm']                     # the qwen3_5 layout as before
    assert export_blockers(to_hybrid(random_teacher('llama', mlp_bias=True), [0], mixer='mamba2'), 'granitemoehybrid') == ['MLP biases']
    bad = to_hybrid(random_teacher('mistral', sliding_window=16, hidden_act='gelu'), [0], mixer='mamba2')
    for hybrid, says in [(q3, 'q/k norms in kept layers'), (gdn, "GDN layers (mixer 'gdn')"),
                         (bad, "sliding-window attention in kept layers; hidden_act 'gelu'")]:
        with pytest.raises(ValueError, match='granitemoehybrid.* cannot represent') as e:
            export_hybrid(hybrid, tmp_path/'out', layout='granitemoehybrid')
        assert says in str(e.value) and '\n' not in str(e.value) and 'Llama, Qwen2 and Mistral' in str(e.value)
        assert not (tmp_path/'out').exists() and list(tmp_path.iterdir()) == []

def test_cli_export_picks_the_layout_from_the_mixer_and_checks_it(tmp_path):
    "`taylor-calibrate export` on a saved Mamba2 hybrid writes granitemoehybrid without --layout, and --check agrees."
    import json, subprocess, sys
    from pathlib import Path
    from taylor_calibrate.hybrid import save_hybrid
    save_hybrid(perturbed(to_hybrid(random_teacher('qwen2'), [0], mixer='mamba2')), tmp_path/'run'/'model')
    exe = Path(sys.executable).parent/'taylor-calibrate'
    r = subprocess.run([exe, 'export', tmp_path/'run', '--out', tmp_path/'native', '--check'], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'layout granitemoehybrid' in r.stdout and 'GraniteMoeHybridForCausalLM' in r.stdout and '32 greedy tokens identical: True' in r.stdout, r.stdout
    assert json.loads((tmp_path/'native'/'config.json').read_text())['model_type'] == 'granitemoehybrid'
