"The console script answers --help and argument errors at once: its parser imports neither torch, transformers nor plotly."
import statistics, subprocess, sys, time
import pytest
from pathlib import Path

EXE = str(Path(sys.executable).with_name('taylor-calibrate'))
HEAVY = ('torch', 'transformers', 'plotly', 'datasets')
LIMIT_S = 1.5

def timed(*args):
    "The console script's result and its wall time in seconds (the median of 3 runs)."
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        r = subprocess.run([EXE, *map(str, args)], capture_output=True, text=True, timeout=60)
        times.append(time.perf_counter() - t0)
    return r, statistics.median(times)

def test_help_is_quick():
    for args in (['--help'], ['demo', '--help'], ['convert', '--help'], ['distill', '--help'], ['export', '--help']):
        r, s = timed(*args)
        assert r.returncode == 0 and 'usage: taylor-calibrate' in r.stdout, r.stderr
        assert s < LIMIT_S, f'{" ".join(args)} took {s:.2f} s'

def test_argument_errors_are_quick(tmp_path):
    cases = [(['convert', '--teacher', 'tiny-qwen2'], 2, 'the following arguments are required: --out'),
             (['distill', '--student', 's', '--tokens', '8', '--out', tmp_path/'o', '--schedule', 'sawtooth'], 2, 'invalid choice'),
             (['convert', '--keep', 'nonsense:0.5', '--teacher', 'tiny-qwen2', '--out', tmp_path/'o'], 1, "--keep 'nonsense:0.5'"),
             (['demo', '--inits', 'naive,magic', '--out', tmp_path/'o'], 1, "unknown init 'magic'"),
             (['convert', '--init', 'zero-gate', '--teacher', 'tiny-qwen2', '--out', tmp_path/'o'], 1, "did you mean 'zero_gate'?"),
             (['demo', '--teacher', 'Qwen/Qwen3-0.6B', '--out', tmp_path/'o'], 1, 'convert takes any teacher'),
             # a teacher name one typo away from a known one: load_teacher's 'did you mean', before any library loads
             (['convert', '--teacher', 'tiny_qwen2', '--out', tmp_path/'o'], 1, "did you mean 'tiny-qwen2'?"),
             (['diagnose', '--teacher', 'smolm2-135m'], 1, "did you mean 'smollm2-135m'?"),
             (['distill', '--student', 's', '--teacher', 'tiny_qwen3', '--tokens', '8', '--out', tmp_path/'o'], 1, "did you mean 'tiny-qwen3'?"),
             (['explore', '--teacher', 'tiny_qwen2'], 1, "did you mean 'tiny-qwen2'?")]
    for args, code, needle in cases:
        r, s = timed(*args)
        assert r.returncode == code and needle in r.stderr and 'Traceback' not in r.stderr, r.stderr
        assert s < LIMIT_S, f'{" ".join(map(str, args))} took {s:.2f} s'
    assert not (tmp_path/'o').exists()

def imported_by(*args) -> set[str]:
    "The top-level modules the console script imports for `args` (python -X importtime)."
    r = subprocess.run([sys.executable, '-X', 'importtime', EXE, *args], capture_output=True, text=True, timeout=60)
    return {l.split('|')[-1].strip().split('.')[0] for l in r.stderr.splitlines() if l.startswith('import time:')}

def test_the_parser_imports_no_heavy_library(tmp_path):
    for args in (['--help'], ['convert', '--help'], ['convert', '--keep', 'nonsense:0.5', '--teacher', 't', '--out', str(tmp_path/'o')],
                 ['convert', '--teacher', 'tiny_qwen2', '--out', str(tmp_path/'o')], ['explore', '--help']):
        mods = imported_by(*args)
        assert 'taylor_calibrate' in mods and not mods & set(HEAVY), (args, sorted(mods & set(HEAVY)))
    code = ("import sys; sys.argv[0] = 'taylor-calibrate'\n"      # as in the console script
            "import taylor_calibrate.cli as c; c.build_parser().parse_args(['demo'])\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == '[]', r.stdout + r.stderr

def test_importing_the_package_imports_no_heavy_library():
    "`import taylor_calibrate` costs neither torch nor transformers: the hybrid types register when transformers loads."
    r = subprocess.run([sys.executable, '-c', f"import sys, taylor_calibrate; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == '[]', r.stdout + r.stderr

FIRST_IMPORTS = ['from transformers import AutoConfig', 'from transformers import AutoModelForCausalLM',
                 'from transformers import LlamaConfig', 'from transformers import Qwen3ForCausalLM', 'import transformers.modeling_utils',
                 'from transformers import AutoTokenizer', 'import taylor_calibrate.convert']

@pytest.mark.parametrize('first', FIRST_IMPORTS)
@pytest.mark.parametrize('package', ['before', 'after'])
def test_transformers_loads_saved_hybrids_after_a_plain_import(saved_hybrid, first, package):
    "Whichever part of transformers loads first, and whether before or after the package, AutoConfig and AutoModelForCausalLM read a saved hybrid (a warning fails)."
    code = '\n'.join(['import taylor_calibrate' if package == 'before' else '', first, 'import taylor_calibrate' if package == 'after' else '',
                      'from transformers import AutoConfig, AutoModelForCausalLM',
                      f'print(type(AutoConfig.from_pretrained({str(saved_hybrid)!r})).__name__, type(AutoModelForCausalLM.from_pretrained({str(saved_hybrid)!r})).__name__)'])
    r = subprocess.run([sys.executable, '-W', 'error', '-c', code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ['TaylorCalibrateQwen3Config', 'TaylorCalibrateQwen3ForCausalLM'], r.stdout + r.stderr[-2000:]

@pytest.fixture(scope='module')
def saved_hybrid(tmp_path_factory):
    "A tiny random Qwen3 teacher's hybrid, saved."
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from taylor_calibrate.convert import to_hybrid
    torch.manual_seed(0)
    teacher = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, head_dim=16, max_position_embeddings=64))
    path = tmp_path_factory.mktemp('hybrid')/'h'
    to_hybrid(teacher, [0]).save_pretrained(path)
    return path
