"""Module layout: one idea per module, layered from the bottom up (a module imports only modules on its own level or below),
`taylor_calibrate.cache` and `taylor_calibrate.hybrid` load without plotting or conversion code, and every name of the
conversion module's public surface is read from `taylor_calibrate.convert` as the very object of the module that defines it."""
import ast, importlib, pickle, re, subprocess, sys
import pytest
from conftest import ROOT

# Bottom to top; a module on a level imports modules of its own level or of the levels below it only. Modules not named here
# (core, distill, cli, ...) sit above them all. The vLLM plugin imports no other module of the package (it runs inside vLLM's
# environment), so it sits at the bottom, and the export can ask it whether it serves a hybrid the export refuses.
LEVELS = [('device', 'gdn', 'kda', 'mamba2', 'outputs', 'taylor', 'teacher', 'stats', 'vllm_plugin'), ('cache',), ('hybrid',), ('convert',), ('policies', 'export')]
LEVEL = {m: i for i, ms in enumerate(LEVELS) for m in ms}
TOP = len(LEVELS)

# Every name `taylor_calibrate.convert` lists in `__all__` when the conversion, the hybrid model type, layer selection, cache
# memory and the export were one module, and where each is defined (names not listed here: convert itself).
CONVERT_NAMES = ['logger', 'SUPPORTED_MODEL_TYPES', 'KV_COPIES', 'PAPER_GDN_OPTIONS', 'POLICIES', 'random_teacher', 'decoder_layers',
                 'check_teacher', 'repeat_kv_heads', 'copy_kv_rows_interleaved', 'fold_head_norm', 'attention_geometry', 'gdn_options_for',
                 'copy_attention_into_gdn', 'parse_policy', 'kept_count', 'uniform_layers', 'resolve_keep', 'hybrid_spec', 'copy_module',
                 'to_hybrid', 'shared_weights', 'unshare_weights', 'converted_layers', 'gdn_modules', 'ar_scores', 'ga_s2_scores',
                 'select_layers', 'plot_layer_scores', 'gdn_state_bytes', 'cache_bytes', 'measured_cache_bytes', 'plot_cache_memory',
                 'HYBRID_PREFIX', 'REPORT_FILE', 'state_tensors', 'GDNCacheLayer', 'gdn_cache_slot', 'GDNAttention', 'hybrid_model_type',
                 'teacher_model_type', 'check_converted_layers', 'write_calibration_report', 'read_calibration_report', 'HybridMixin',
                 'register_hybrid_types', 'hybrid_classes', 'save_hybrid', 'load_hybrid', 'EXPORT_LAYOUTS', 'VLLM_CPU_GDN_HEAD_DIMS',
                 'export_blockers', 'attention_interval', 'to_native', 'engine_problems', 'export_hybrid', 'check_export']
HOME = {**dict.fromkeys(['gdn_state_bytes', 'cache_bytes', 'measured_cache_bytes', 'plot_cache_memory', 'state_tensors', 'GDNCacheLayer',
                         'gdn_cache_slot'], 'cache'),
        **dict.fromkeys(['SUPPORTED_MODEL_TYPES', 'decoder_layers', 'HYBRID_PREFIX', 'REPORT_FILE', 'GDNAttention', 'hybrid_model_type',
                         'teacher_model_type', 'check_converted_layers', 'write_calibration_report', 'read_calibration_report',
                         'HybridMixin', 'register_hybrid_types', 'hybrid_classes', 'save_hybrid', 'load_hybrid'], 'hybrid'),
        **dict.fromkeys(['ar_scores', 'ga_s2_scores', 'select_layers', 'plot_layer_scores'], 'policies'),
        **dict.fromkeys(['EXPORT_LAYOUTS', 'VLLM_CPU_GDN_HEAD_DIMS', 'export_blockers', 'attention_interval', 'to_native',
                         'engine_problems', 'export_hybrid', 'check_export'], 'export')}

def package_imports(path) -> set[str]:
    "The package modules a module file imports, at its top or inside functions (`taylor_calibrate` itself and `__version__` aside)."
    modules = {p.stem for p in (ROOT/'taylor_calibrate').glob('*.py')}
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split('.')[1] for a in node.names if a.name.startswith('taylor_calibrate.')}
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ''
            if node.level == 0 and not (name == 'taylor_calibrate' or name.startswith('taylor_calibrate.')): continue
            if node.level > 1: raise AssertionError(f'{path.name}: import from outside the package directory ({"." * node.level}{name})')
            parts = name.split('.')[1:] if node.level == 0 else ([name.split('.')[0]] if name else [])
            if parts: out.add(parts[0])
            else: out |= {a.name for a in node.names if a.name in modules}   # `from . import x` / `from taylor_calibrate import x`
    return out

def test_the_levels_name_modules_that_exist():
    assert all((ROOT/'taylor_calibrate'/f'{m}.py').exists() for m in LEVEL), [m for m in LEVEL if not (ROOT/'taylor_calibrate'/f'{m}.py').exists()]

def test_no_module_imports_a_module_above_it():
    "A lower module never imports a higher one, not even inside a function."
    # convert's `__getattr__` reads the names of the modules next to it through importlib when asked: the one way up, by design
    wrong = []
    for p in sorted((ROOT/'taylor_calibrate').glob('*.py')):
        if p.name.startswith('_'): continue
        level = LEVEL.get(p.stem, TOP)
        wrong += [f'{p.stem} (level {level}) imports {m} (level {LEVEL.get(m, TOP)})' for m in sorted(package_imports(p))
                  if LEVEL.get(m, TOP) > level]
    assert not wrong, '\n'.join(wrong)

def test_the_module_table_names_every_module():
    "The docs' module table (index, and README built from it) names each module of the package with the notebook it is exported from."
    table = (ROOT/'README.md').read_text().split('| notebook | what it explains | module |')[1].split('\n\n')[0]
    named = set(re.findall(r'`(\w+)`', ' '.join(l.rsplit('|', 2)[-2] for l in table.splitlines() if l.startswith('|'))))
    modules = {p.stem for p in (ROOT/'taylor_calibrate').glob('*.py') if not p.stem.startswith('_')}
    assert modules <= named, sorted(modules - named)

def test_the_import_parser(tmp_path):
    (tmp_path/'m.py').write_text("from .gdn import GatedDeltaNet\nfrom . import cache\nfrom taylor_calibrate import __version__\n"
                                 "import torch\ndef f():\n    from taylor_calibrate.core import calibrate\n    import taylor_calibrate.export\n")
    assert package_imports(tmp_path/'m.py') == {'gdn', 'cache', 'core', 'export'}

def loaded_after(statement: str, skip_init: bool) -> set[str]:
    "The modules a fresh interpreter holds after `statement`; with `skip_init`, the package's `__init__` is not run."
    stub = ("import importlib.util, sys, types\n"
            "spec = importlib.util.find_spec('taylor_calibrate')\n"
            "pkg = types.ModuleType('taylor_calibrate'); pkg.__path__ = list(spec.submodule_search_locations)\n"
            "sys.modules['taylor_calibrate'] = pkg\n") if skip_init else 'import sys\n'
    code = stub + statement + "\nprint(' '.join(sorted(sys.modules)))"
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return set(r.stdout.split())

HEAVY = {'plotly', 'taylor_calibrate.convert', 'taylor_calibrate.policies', 'taylor_calibrate.export', 'taylor_calibrate.core'}

@pytest.mark.parametrize('module', ['cache', 'hybrid'])
def test_cache_and_hybrid_load_alone(module):
    "Their own imports bring neither plotly nor conversion, layer selection, export or calibration code."
    loaded = loaded_after(f'import taylor_calibrate.{module}', skip_init=True)
    assert f'taylor_calibrate.{module}' in loaded and not loaded & HEAVY, sorted(loaded & HEAVY)

def test_the_package_loads_without_plotting_or_higher_modules():
    "`import taylor_calibrate.hybrid`, the package's `__init__` included, loads no plotting and nothing above the hybrid model."
    loaded = loaded_after('import taylor_calibrate.hybrid', skip_init=False)
    assert not loaded & HEAVY, sorted(loaded & HEAVY)

def test_convert_names_are_the_defining_modules_objects():
    convert = importlib.import_module('taylor_calibrate.convert')
    for name in CONVERT_NAMES:
        home = importlib.import_module(f'taylor_calibrate.{HOME.get(name, "convert")}')
        assert name in home.__dict__ and name in home.__all__, f'{name} is not defined in {home.__name__}'
        assert getattr(convert, name) is getattr(home, name), name
        assert name in dir(convert), name
    assert convert.logger.name == 'taylor_calibrate.convert'
    ns = {}
    exec('from taylor_calibrate.convert import *', ns)
    assert set(CONVERT_NAMES) <= set(ns), sorted(set(CONVERT_NAMES) - set(ns))
    from taylor_calibrate.convert import save_hybrid, export_hybrid, select_layers, GDNCacheLayer, HYBRID_PREFIX, EXPORT_LAYOUTS  # noqa: F401

def test_hybrid_classes_by_either_module():
    "The hybrid classes live in `taylor_calibrate.hybrid`; pickles naming `taylor_calibrate.convert` find them too."
    import taylor_calibrate.convert as convert, taylor_calibrate.hybrid as hybrid
    from taylor_calibrate.convert import TaylorCalibrateQwen2ForCausalLM
    assert TaylorCalibrateQwen2ForCausalLM is hybrid.hybrid_classes('qwen2')[1]
    for cfg, model in hybrid.register_hybrid_types().values():
        for cls in (cfg, model):
            assert cls.__module__ == 'taylor_calibrate.hybrid' and getattr(convert, cls.__name__) is cls is getattr(hybrid, cls.__name__)
            assert pickle.loads(pickle.dumps(cls)) is cls
            assert pickle.loads(f'ctaylor_calibrate.convert\n{cls.__name__}\n.'.encode()) is cls   # a pickle naming the convert path

def test_unknown_names_are_attribute_errors():
    import taylor_calibrate.convert as convert
    for name in ('no_such_name', 'TaylorCalibrateNoSuchModel', '__path__'):
        assert not hasattr(convert, name)
    with pytest.raises(AttributeError, match="module 'taylor_calibrate.convert' has no attribute 'no_such_name'"): convert.no_such_name
