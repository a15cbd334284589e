"Export to transformers' native Qwen3.5 hybrids: a calibrated Qwen3 hybrid, loaded in a fresh interpreter without taylor_calibrate, gives the hybrid's logits and greedy tokens; unrepresentable teachers are refused in one line."
import json, subprocess, sys, textwrap
from pathlib import Path
import pytest, torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
from conftest import with_dynamics
from taylor_calibrate.convert import gdn_modules, to_hybrid
from taylor_calibrate.hybrid import save_hybrid
from taylor_calibrate.export import check_export, export_blockers, export_hybrid

torch.set_num_threads(1)
SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=None)
EXE = str(Path(sys.executable).with_name('taylor-calibrate'))

def tiny(cls, cfg_cls, seed=0, **kw):
    torch.manual_seed(seed)
    m = cls(cfg_cls(**{**SMALL, **kw})).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if 'norm' in n: p.uniform_(0.5, 1.5)
            elif n.endswith('_proj.bias'): p.normal_(0, 0.5)
    return m

def tiny_qwen3(**kw): return tiny(Qwen3ForCausalLM, Qwen3Config, head_dim=16, **kw)

# Written out here rather than taken from check_export, so that the test does not rest on the code it checks.
LOAD_IN_A_FRESH_INTERPRETER = '''
import sys
sys.modules['fla'] = None            # a CPU install without flash-linear-attention: transformers runs its PyTorch delta rule
import torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
ids = torch.load(sys.argv[2])
with torch.no_grad():
    logits = m(ids).logits
    tokens = m.generate(ids[:1], attention_mask=torch.ones_like(ids[:1]), max_new_tokens=32, do_sample=False)
assert 'taylor_calibrate' not in sys.modules
torch.save(dict(logits=logits, tokens=tokens, cls=type(m).__name__), sys.argv[3])
'''

def compare_in_fresh_interpreter(hybrid, path, x, tmp_path):
    torch.save(x, tmp_path/'ids.pt')
    r = subprocess.run([sys.executable, '-c', LOAD_IN_A_FRESH_INTERPRETER, str(path), str(tmp_path/'ids.pt'), str(tmp_path/'out.pt')],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = torch.load(tmp_path/'out.pt')
    with torch.no_grad():
        logits = hybrid(x).logits
        tokens = hybrid.generate(x[:1], attention_mask=torch.ones_like(x[:1]), max_new_tokens=32, do_sample=False)
    return got, (got['logits'] - logits).abs().max().item() / logits.abs().max().item(), torch.equal(got['tokens'], tokens)

def test_calibrated_qwen3_export_matches_the_hybrid(tmp_path):
    "A tiny random Qwen3 (GQA, q/k norm) calibrated with init='taylor', exported to qwen3_5, loaded without the package: same logits, same tokens."
    from taylor_calibrate.core import calibrate
    teacher = tiny_qwen3(tie_word_embeddings=True)
    data = torch.randint(0, 96, (8192,), generator=torch.Generator().manual_seed(2))
    hybrid = calibrate(teacher, data, keep=[0, 2], init='taylor', seq_len=128, calib_tokens=512, heldout_tokens=256, steps=5, progress=False)
    assert export_blockers(hybrid) == []
    export_hybrid(hybrid, tmp_path/'native')
    cfg = json.loads((tmp_path/'native'/'config.json').read_text())
    assert (cfg['model_type'], cfg['architectures'], cfg['attention_bias']) == ('qwen3_5_text', ['Qwen3_5ForCausalLM'], False)
    assert cfg['rope_parameters']['partial_rotary_factor'] == cfg['partial_rotary_factor'] == 1.0 and cfg['rms_norm_eps'] == 1e-5
    from safetensors import safe_open
    with safe_open(str(tmp_path/'native'/'model.safetensors'), 'pt') as st:   # serving engines drop attention biases: none is written
        assert not [k for k in st.keys() if k.endswith('.bias')]
    assert (tmp_path/'native'/'calibration_report.json').exists()
    x = torch.randint(0, 96, (2, 100), generator=torch.Generator().manual_seed(4))
    got, rel, same = compare_in_fresh_interpreter(hybrid, tmp_path/'native', x, tmp_path)
    print(f'max |logit difference| / max |logit| = {rel:.2e}')
    assert got['cls'] == 'Qwen3_5ForCausalLM' and rel < 1e-4 and same
    res = check_export(hybrid, tmp_path/'native', x)   # the package's own check agrees
    assert res['max_rel_diff'] < 1e-4 and res['same_tokens'] and res['imported'] == []

def test_short_convolution_and_matching_eps_copy_weights_untouched(tmp_path):
    "With norm_eps = the teacher's rms_norm_eps no rescaling is needed: embedding and projections are stored bit for bit."
    hybrid = with_dynamics(to_hybrid(tiny_qwen3(), [1], use_short_conv=True, norm_eps=1e-6))
    with torch.no_grad():
        for m in gdn_modules(hybrid).values():
            for c in (m.q_conv1d, m.k_conv1d, m.v_conv1d): c.weight.add_(0.1 * torch.randn_like(c.weight))
    export_hybrid(hybrid, tmp_path/'native')
    from safetensors.torch import load_file
    w = load_file(tmp_path/'native'/'model.safetensors')
    assert torch.equal(w['model.embed_tokens.weight'], hybrid.model.embed_tokens.weight)
    assert torch.equal(w['model.layers.0.linear_attn.out_proj.weight'], hybrid.model.layers[0].self_attn.gdn.o_proj.weight)
    assert json.loads((tmp_path/'native'/'config.json').read_text())['taylor_calibrate_export']['residual_scale'] == 1.0
    _, rel, same = compare_in_fresh_interpreter(hybrid, tmp_path/'native', torch.randint(0, 96, (2, 70)), tmp_path)
    assert rel < 1e-4 and same

def test_qwen3_moe_exports_to_qwen3_5_moe(tmp_path):
    teacher = tiny(Qwen3MoeForCausalLM, Qwen3MoeConfig, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                   norm_topk_prob=True)
    hybrid = with_dynamics(to_hybrid(teacher, [0, 3]))
    assert export_blockers(hybrid) == ["mixture-of-experts MLP (layout 'qwen3_5_moe')"]
    assert export_blockers(hybrid, 'qwen3_5_moe') == []
    export_hybrid(hybrid, tmp_path/'native', layout='qwen3_5_moe')
    assert json.loads((tmp_path/'native'/'config.json').read_text())['model_type'] == 'qwen3_5_moe_text'
    got, rel, same = compare_in_fresh_interpreter(hybrid, tmp_path/'native', torch.randint(0, 96, (2, 80)), tmp_path)
    assert got['cls'] == 'Qwen3_5MoeForCausalLM' and rel < 1e-4 and same
    unnormalised = to_hybrid(tiny(Qwen3MoeForCausalLM, Qwen3MoeConfig, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=32, norm_topk_prob=False), [0])
    assert export_blockers(unnormalised, 'qwen3_5_moe') == ['routing weights not renormalised (norm_topk_prob=False)']

def test_teachers_the_layout_cannot_represent_are_refused_in_one_line(tmp_path):
    qwen2 = to_hybrid(tiny(Qwen2ForCausalLM, Qwen2Config), [0])
    with pytest.raises(ValueError) as e: export_hybrid(qwen2, tmp_path/'x')
    assert str(e.value) == ("layout 'qwen3_5' cannot represent this hybrid exactly: q/k/v biases in converted layers; no q/k norm "
                            "(the qwen3_5 layout takes hybrids of Qwen3 teachers; vLLM serves this one as saved through the package's "
                            'plugin: pip install "taylor-calibrate[serve]" in vLLM\'s environment, then vllm serve its folder)')
    assert not (tmp_path/'x').exists()
    assert export_blockers(to_hybrid(tiny(LlamaForCausalLM, LlamaConfig), [0])) == ['no q/k norm']
    assert export_blockers(to_hybrid(tiny(MistralForCausalLM, MistralConfig, sliding_window=None), [0])) == ['no q/k norm']
    windowed = to_hybrid(tiny_qwen3(use_sliding_window=True, sliding_window=16, max_window_layers=0), [0])
    assert export_blockers(windowed) == ['sliding-window attention in kept layers']
    assert export_blockers(to_hybrid(tiny_qwen3(), [0], allow_neg_eigval=True)) == ['negative eigenvalues (allow_neg_eigval=True)']
    with pytest.raises(ValueError, match='not a hybrid'): export_blockers(tiny_qwen3())

def test_cli_export_with_check(tmp_path):
    hybrid = with_dynamics(to_hybrid(tiny_qwen3(), [0]))
    save_hybrid(hybrid, tmp_path/'run'/'model')
    r = subprocess.run([EXE, 'export', tmp_path/'run', '--out', tmp_path/'native', '--check'], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'Qwen3_5ForCausalLM' in r.stdout and '32 greedy tokens identical: True' in r.stdout, r.stdout
    assert json.loads((tmp_path/'native'/'config.json').read_text())['model_type'] == 'qwen3_5_text'
    r = subprocess.run([EXE, 'export', tmp_path/'run', '--out', tmp_path/'moe', '--layout', 'qwen3_5_moe'], capture_output=True, text=True)
    assert r.returncode == 1 and 'Traceback' not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("taylor-calibrate export: error: layout 'qwen3_5_moe' cannot represent this "
                                                        'hybrid exactly: dense MLP layers (the layout has experts in every layer) '
                                                        '(the qwen3_5_moe layout takes hybrids of Qwen3 MoE teachers; vLLM serves this one')

def test_cli_dtype_auto_computes_in_float32_on_a_cpu_and_bfloat16_when_asked(tmp_path):
    "--dtype auto on a CPU loads a bfloat16 teacher in float32 (bfloat16 matmuls are slow there); --dtype bfloat16 keeps it."
    from taylor_calibrate.teacher import TEACHER_DIR
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(TEACHER_DIR)
    teacher = tiny_qwen3(vocab_size=len(tok), num_hidden_layers=2).to(torch.bfloat16)
    teacher.save_pretrained(tmp_path/'teacher'); tok.save_pretrained(tmp_path/'teacher')
    (tmp_path/'text.txt').write_text('\n'.join(f'Line {i} of calibration text about lists and dicts.' for i in range(200)))
    dtypes = {}
    for flag in ('auto', 'bfloat16'):
        r = subprocess.run([EXE, 'convert', '--teacher', tmp_path/'teacher', '--keep', '0', '--init', 'naive', '--data', tmp_path/'text.txt',
                            '--calib-tokens', '128', '--seq-len', '64', '--dtype', flag, '--out', tmp_path/flag], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        dtypes[flag] = json.loads((tmp_path/flag/'model'/'config.json').read_text())['dtype']
    assert dtypes == {'auto': 'float32', 'bfloat16': 'bfloat16'}

def test_exporting_head_dimension_32_warns_that_vllms_cpu_kernel_refuses_it(tmp_path, caplog):
    "The shipped tiny-qwen3 has head dimension 32: its export logs one line per engine problem, vLLM's CPU kernel first."
    import logging
    from taylor_calibrate.teacher import load_teacher
    teacher, _ = load_teacher('tiny-qwen3')
    hybrid = to_hybrid(teacher, [3, 7, 11])                   # where SGLang places attention with full_attention_interval 4
    with caplog.at_level(logging.WARNING, logger='taylor_calibrate.convert'): export_hybrid(hybrid, tmp_path/'native')
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["vLLM's CPU build refuses GDN head dimension 32 (its CPU kernel takes 64 and 128; GPU engines accept 32)"], lines
    assert json.loads((tmp_path/'native'/'config.json').read_text())['full_attention_interval'] == 4
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger='taylor_calibrate.convert'): export_hybrid(to_hybrid(teacher, [0, 4, 8]), tmp_path/'n2')
    assert 'SGLang places attention by full_attention_interval (4: layers 3, 7, 11); this hybrid keeps 0, 4, 8' in [r.getMessage() for r in caplog.records]
