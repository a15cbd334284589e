"""The mixer table: a new mixer is one module and one table entry.

`toy_mixer.py` is a toy mixer in one module (a per-head decaying sum of the teacher's values). Registered with one entry, it
goes through conversion, every recipe of `calibrate` (its Phase 1 from the shared targets, its zero gate, its gauge, Phase 2
on the parameter groups its entry names), the report, a checkpoint folder, saving and loading, generation with the cache and
the cache's byte count; the export and the vLLM plugin refuse it by name. Nothing of the package is edited for it. The
built-in entries are checked against what conversion and calibration did before the table: the same layers, the same
Phase-2 groups, the same options and slot sizes.
"""
import json, math
import pytest, torch
from transformers import AutoModelForCausalLM
import toy_mixer
from taylor_calibrate.mixers import MIXERS, Mixer, register_mixer, get_mixer, mixer_of, mixer_class
from taylor_calibrate.convert import random_teacher, to_hybrid, gdn_modules, gdn_options_for, save_hybrid, load_hybrid
from taylor_calibrate.cache import cache_bytes, measured_cache_bytes, gdn_state_bytes
from taylor_calibrate.core import calibrate, phase1, _param_groups, get_recipe
from taylor_calibrate.export import export_blockers
from taylor_calibrate.vllm_plugin import hybrid_problems

torch.set_num_threads(1)
TOY = Mixer('toy', 'a decaying sum of the values', layer='toy_mixer:ToyMixer', shape='toy_mixer:toy_shape',
            copy='toy_mixer:copy_attention_into_toy', slot_bytes='toy_mixer:toy_slot_bytes', phase1={'closed_form': 'toy_mixer:toy_phase1', 'fit': 'toy_mixer:toy_fit_phase1'},
            close_gate='toy_mixer:close_toy_gate', gauge='toy_mixer:gauge_toy', frozen=('o_proj',), projections=('v_proj',))


@pytest.fixture
def toy():
    "The toy registered for one test, and out of the table after it."
    register_mixer(TOY)
    yield MIXERS['toy']
    MIXERS.pop('toy')


@pytest.fixture(scope='module')
def teacher(): return random_teacher('qwen2')


def ids(n=8, T=32, seed=0): return torch.randint(0, 96, (n, T), generator=torch.Generator().manual_seed(seed))

KW = dict(keep=[0, 2], seq_len=32, calib_tokens=128, heldout_tokens=64, steps=3, progress=False, mixer='toy')


def test_the_toy_converts(toy, teacher):
    h = to_hybrid(teacher, [0, 2], mixer='toy')
    layers = gdn_modules(h)
    assert sorted(layers) == [1, 3] and all(type(l) is toy_mixer.ToyMixer for l in layers.values())
    assert h.config.taylor_calibrate['mixer'] == 'toy'
    assert h.config.taylor_calibrate['gdn_options'] == dict(hidden_size=64, num_heads=4, head_dim=16)
    attn = teacher.model.layers[1].self_attn
    torch.testing.assert_close(layers[1].o_proj.weight, attn.o_proj.weight, rtol=0, atol=0)
    assert mixer_of(layers[1]) is toy and mixer_class('toy') is toy_mixer.ToyMixer


@pytest.mark.parametrize('init', ['naive', 'zero_gate', 'phase1', 'phase2', 'taylor', 'taylor+'])
def test_every_recipe_calibrates_the_toy(toy, teacher, init):
    h = calibrate(teacher, ids(), init=init, **KW)
    rep = h.calibration_report
    assert rep.converted == [1, 3] and len(rep.heads) == 2 * 4
    recipe = get_recipe(init)
    if recipe.zero_gate:                                              # the branch emits (next to) nothing
        assert all(l['ratio_copy'] < 1e-9 for l in rep.layers)
    if recipe.phase1:
        d = torch.tensor([r['mean_distance'] for r in rep.heads if r['layer'] == 1])
        got = torch.tensor([r['half_life'] for r in rep.heads if r['layer'] == 1])
        if not recipe.phase2: torch.testing.assert_close(got, d.clamp_min(0.5).clamp(max=math.log(2) / 1e-3), rtol=1e-4, atol=0)
        assert all(0.3 - 1e-6 <= r['beta_star'] <= 0.7 + 1e-6 for r in rep.heads)
    if recipe.phase2: assert all(l['mse_phase2'] <= l['mse_copy' if not recipe.phase1 else 'mse_phase1'] for l in rep.layers)
    assert torch.isfinite(h(ids(2)).logits).all()


def test_phase2_groups_are_the_entry(toy):
    layer = toy_mixer.ToyMixer(32, 2, 16)
    qkv, gates = _param_groups(layer, get_recipe('taylor'))
    assert [id(p) for p in qkv['params']] == [id(layer.v_proj.weight)]
    assert {id(p) for p in gates['params']} == {id(layer.A_log), id(layer.dt_bias), id(layer.b)}
    assert not layer.o_proj.weight.requires_grad


def test_a_phase1_variant_is_one_more_key(toy, teacher):
    "A second Phase-1 function in the entry is selected by name; an unknown one is refused with the names there are."
    seen = []
    register_mixer(Mixer(**{**TOY.__dict__, 'phase1': {**TOY.phase1, 'halved': lambda layer, *a: seen.append(layer) or {}}}), replace=True)
    layer = toy_mixer.ToyMixer(64, 4, 16)
    phase1(layer, {}, None, None, None, get_recipe('phase1'), variant='halved')
    assert seen == [layer]
    with pytest.raises(ValueError, match="mixer 'toy' has no Phase 1 'lsq'; it has 'closed_form', 'fit', 'halved'"):
        phase1(layer, {}, None, None, None, get_recipe('phase1'), variant='lsq')


def test_saved_toy_hybrid_loads_and_generates_with_its_cache(toy, teacher, tmp_path):
    h = calibrate(teacher, ids(), init='phase1', **KW)
    save_hybrid(h, tmp_path/'toy')
    assert json.loads((tmp_path/'toy'/'config.json').read_text())['taylor_calibrate']['mixer'] == 'toy'
    for loaded in (load_hybrid(tmp_path/'toy'), AutoModelForCausalLM.from_pretrained(tmp_path/'toy')):
        assert loaded.calibration_report.converted == [1, 3]
        x = ids(2, 21)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x).logits, h(x).logits, rtol=0, atol=0)
            out = loaded.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
            steps = x
            for _ in range(6): steps = torch.cat([steps, loaded(steps).logits[:, -1:].argmax(-1)], 1)
        assert torch.equal(out.sequences, steps)
        assert measured_cache_bytes(out.past_key_values)['gdn'] == cache_bytes(loaded.config, 27, batch_size=2)['gdn'] == 2 * 2 * 4 * 16 * 4


def test_a_killed_toy_calibration_resumes(toy, teacher, tmp_path):
    first = calibrate(teacher, ids(), init='taylor', checkpoint_dir=tmp_path/'ck', **KW)
    (tmp_path/'ck'/'layer_003.pt').unlink()
    again = calibrate(teacher, ids(), init='taylor', checkpoint_dir=tmp_path/'ck', **KW)
    assert again.calibration_report.resumed == [1]
    for (n, p), (_, q) in zip(first.named_parameters(), again.named_parameters()): assert torch.equal(p, q), n


def test_the_export_and_the_plugin_refuse_the_toy_by_name(toy, teacher):
    h = to_hybrid(random_teacher('qwen3'), [0], mixer='toy')
    assert export_blockers(h, 'qwen3_5') == ["TOY layers (mixer 'toy'): the layout's linear attention is Gated DeltaNet, one decay per head"]
    assert export_blockers(h, 'granitemoehybrid')[0].startswith("TOY layers (mixer 'toy'): the layout's linear layers are Mamba2")
    assert hybrid_problems(h.config) == ["converted layers of mixer 'toy' (the plugin serves Gated DeltaNet layers, mixer 'gdn')"]


def test_registering(toy):
    with pytest.raises(ValueError, match="a mixer named 'toy' is in the table"): register_mixer(TOY)
    with pytest.raises(TypeError): register_mixer('toy')
    with pytest.raises(ValueError, match="unknown mixer 'toys'; accepted: 'gdn', 'kda', 'mamba2', 'toy'"): get_mixer('toys')
    bare = Mixer('bare', 'no gate', layer=toy_mixer.ToyMixer, shape=toy_mixer.toy_shape, copy=toy_mixer.copy_attention_into_toy,
                 slot_bytes=toy_mixer.toy_slot_bytes)                   # the parts themselves, not their paths
    assert bare.part('layer') is toy_mixer.ToyMixer
    with pytest.raises(ValueError, match="mixer 'bare' has no close_gate part"): bare.part('close_gate')
    with pytest.raises(ValueError, match="mixer 'bare' has no Phase 1 'closed_form'; it has none"): bare.phase1_for()
    with pytest.raises(ValueError, match="'module:name' path"): Mixer('x', '', 'no_colon', None, None, None).part('layer')


@pytest.mark.parametrize('kind', ['qwen2', 'qwen3', 'llama'])
def test_the_built_in_entries_do_what_conversion_did(kind):
    "Each built-in mixer's options, slot size and Phase-2 groups are those conversion and calibration used before the table."
    attn = random_teacher(kind).model.layers[0].self_attn
    bias = kind == 'qwen2'
    gdn = gdn_options_for(attn, 'gdn')
    assert gdn == dict(expand_v=1.0, use_short_conv=False, conv_size=4, qkv_activation='silu', use_gate=True, allow_neg_eigval=False,
                       norm_eps=1e-5, chunk_size=64, hidden_size=64, num_heads=4, head_dim=16, qkv_bias=bias)
    assert list(gdn) == ['expand_v', 'use_short_conv', 'conv_size', 'qkv_activation', 'use_gate', 'allow_neg_eigval', 'norm_eps',
                         'chunk_size', 'hidden_size', 'num_heads', 'head_dim', 'qkv_bias']
    m2 = gdn_options_for(attn, 'mamba2')
    assert {k: m2[k] for k in ('hidden_size', 'num_heads', 'head_dim', 'state_size', 'n_groups')} == dict(hidden_size=64, num_heads=4,
                                                                                                             head_dim=16, state_size=16, n_groups=4)
    assert gdn_state_bytes(gdn) == gdn_state_bytes(gdn, mixer='gdn') == 4 * 16 * 16 * 4
    assert gdn_state_bytes({**gdn, 'use_short_conv': True}, dtype=torch.bfloat16) == 4 * 16 * 16 * 4 + 4 * 48 * 3 * 2
    assert gdn_state_bytes(m2) == gdn_state_bytes(m2, mixer='mamba2') == 4 * 16 * 16 * 4 + (64 + 2 * 64) * (m2['conv_size'] - 1) * 4
    for name, layer in (('gdn', mixer_class('gdn')(**gdn)), ('mamba2', mixer_class('mamba2')(**m2))):
        qkv, gates = _param_groups(layer, get_recipe('taylor'))
        frozen = [n for n, p in layer.named_parameters() if not p.requires_grad]
        assert frozen == (['o_norm.weight', 'o_proj.weight'] if name == 'gdn' else ['out_proj.weight']), frozen
        named = {id(p): n for n, p in layer.named_parameters()}
        assert [named[id(p)] for p in qkv['params']] == ([n for n in named.values() if n.split('.')[0] in ('q_proj', 'k_proj', 'v_proj')]
                                                         if name == 'gdn' else ['in_proj.weight', 'conv1d.weight', 'conv1d.bias'])
