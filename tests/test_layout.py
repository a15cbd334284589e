"""Module layout: one idea per module, layered from the bottom up (each module's level is one above the highest it imports, and
the table below lists every module at its level), no circle of imports (those inside functions, and the mixer table's named
parts, included), `core` within its size, each mixer's code in its own modules, `taylor_calibrate.cache` and
`taylor_calibrate.hybrid` loading without plotting or conversion code, and every name of the conversion module's and the
calibration modules' public surface read from where it always was, as the very object of the module that defines it."""
import ast, importlib, pickle, re, subprocess, sys
import pytest
from conftest import ROOT

# Every module of the package at its level: a module imports only modules of lower levels (at its top or inside a function),
# and sits one above the highest of them. The building blocks import nothing of the package's; the mixer table names its
# parts as 'module:name' paths and imports none of them, so that the command line and the vLLM plugin read it without torch.
LEVELS = [('attention', 'device', 'mixers', 'outputs', 'probes', 'report_page', 'resume', 'stats', 'taylor', 'teacher'),
          ('cache', 'gdn', 'vllm_plugin'),
          ('hybrid', 'kda', 'mamba2', 'vllm_model', 'windows'),
          ('convert', 'targets'),
          ('distill', 'export', 'fit', 'policies'),
          ('gdn_calibrate', 'mamba2_calibrate'),
          ('core', 'kda_calibrate'),
          ('explore', 'regime'),
          ('cli',)]
LEVEL = {m: i for i, ms in enumerate(LEVELS) for m in ms}
CORE_LINES = 600   # `core` holds the method: the recipes, Phase 1 through the mixer table, Phase 2, calibrate and its report

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
                 'export_blockers', 'attention_interval', 'to_native', 'engine_problems', 'export_hybrid', 'check_export',
                 'copied_projections', 'copy_attention_into_mamba2']
HOME = {**dict.fromkeys(['gdn_state_bytes', 'cache_bytes', 'measured_cache_bytes', 'plot_cache_memory', 'state_tensors', 'GDNCacheLayer',
                         'gdn_cache_slot'], 'cache'),
        **dict.fromkeys(['HYBRID_PREFIX', 'REPORT_FILE', 'GDNAttention', 'hybrid_model_type', 'teacher_model_type', 'check_converted_layers',
                         'write_calibration_report', 'read_calibration_report', 'HybridMixin', 'register_hybrid_types', 'hybrid_classes',
                         'save_hybrid', 'load_hybrid'], 'hybrid'),
        **dict.fromkeys(['SUPPORTED_MODEL_TYPES', 'decoder_layers', 'check_teacher', 'repeat_kv_heads', 'copy_kv_rows_interleaved', 'KV_COPIES',
                         'fold_head_norm', 'attention_geometry', 'copied_projections'], 'attention'),
        'copy_attention_into_gdn': 'gdn_calibrate', 'copy_attention_into_mamba2': 'mamba2_calibrate',
        **dict.fromkeys(['ar_scores', 'ga_s2_scores', 'select_layers', 'plot_layer_scores'], 'policies'),
        **dict.fromkeys(['EXPORT_LAYOUTS', 'VLLM_CPU_GDN_HEAD_DIMS', 'export_blockers', 'attention_interval', 'to_native',
                         'engine_problems', 'export_hybrid', 'check_export'], 'export')}

# Every name `taylor_calibrate.core`, `kda_calibrate` and `mamba2_calibrate` listed in `__all__` when Phase 1 of every mixer
# was reached through `core`, and where each is defined now (names not listed here: the module itself).
CORE_NAMES = ['RECIPES', 'REPORT_COLUMNS', 'EVAL_SPLIT', 'CHECKPOINT_SETTINGS', 'CHECKPOINT_SELECTION', 'CHECKPOINT_PROBES',
              'CHECKPOINT_PROBE_SECONDS', 'b_dt', 'half_life', 'realised_half_life', 'realised_beta', 'set_decay', 'concentration_minmax',
              'concentration_relative', 'beta_star', 'concentration', 'set_write_gate', 'gated_head_outputs', 'set_value_scale',
              'alpha_star', 'set_output_gate', 'context_rms', 'constant_direction', 'set_constant_output_gate', 'value_output_norms',
              'balanced_gauge', 'rescale_value_output', 'phase1', 'layer_fit', 'phase2', 'Recipe', 'get_recipe', 'CalibrationReport',
              'token_windows', 'calibrate', 'describe_data', 'windows_fingerprint', 'open_checkpoint_dir', 'report_summary', 'report_html',
              'BATCH_BYTES', 'CAPTURE_BUDGET', 'CAPTURE_FLOOR', 'windows_at_once', 'valid_by_windows', 'ols_by_windows', 'mean_by_windows',
              'mse_backward', 'capture_bytes', 'capture_groups']
CORE_HOME = {**dict.fromkeys(['b_dt', 'half_life', 'realised_half_life', 'realised_beta', 'concentration_minmax', 'concentration_relative',
                              'beta_star', 'concentration', 'alpha_star', 'context_rms', 'constant_direction'], 'targets'),
             **dict.fromkeys(['set_decay', 'set_write_gate', 'gated_head_outputs', 'set_value_scale', 'set_output_gate',
                              'set_constant_output_gate'], 'gdn_calibrate'),
             **dict.fromkeys(['value_output_norms', 'balanced_gauge', 'rescale_value_output'], 'attention'),
             **dict.fromkeys(['REPORT_COLUMNS', 'report_summary', 'report_html'], 'report_page'),
             **dict.fromkeys(['CHECKPOINT_SETTINGS', 'CHECKPOINT_SELECTION', 'CHECKPOINT_PROBES', 'CHECKPOINT_PROBE_SECONDS',
                              'windows_fingerprint', 'open_checkpoint_dir'], 'resume'),
             **dict.fromkeys(['BATCH_BYTES', 'CAPTURE_BUDGET', 'CAPTURE_FLOOR', 'windows_at_once', 'valid_by_windows', 'ols_by_windows',
                              'mean_by_windows', 'mse_backward', 'capture_bytes', 'capture_groups'], 'windows')}
MIXER_MODULE_NAMES = {'kda_calibrate': ['set_constant_gate', 'close_output_gate', 'channel_distance'],
                      'mamba2_calibrate': ['set_step', 'set_constant_z', 'set_norm_amplitude', 'close_mamba2_gate', 'gauge_mamba2', 'mamba2_phase1']}

# Each mixer's code: its layer's module and its own; KDA's layer is a GDN layer, and it shares GDN's copy, cache slot and gauge.
MIXER_MODULES = {'gdn': {'gdn', 'gdn_calibrate'}, 'kda': {'kda', 'kda_calibrate', 'gdn_calibrate'}, 'mamba2': {'mamba2', 'mamba2_calibrate'}}
# The stages and the method reach a mixer through the table: none imports a mixer's module other than GDN's layer (its kernel's
# buffers, the default layer's type), and none compares a mixer's name with a literal.
STAGES = ('attention', 'cache', 'hybrid', 'convert', 'policies', 'export', 'windows', 'targets', 'core', 'vllm_plugin', 'cli')

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

def modules() -> list[str]:
    return sorted(p.stem for p in (ROOT/'taylor_calibrate').glob('*.py') if not p.stem.startswith('_'))

def import_graph() -> dict:
    "module -> the package modules it imports (at its top or inside functions)."
    return {m: package_imports(ROOT/'taylor_calibrate'/f'{m}.py') - {m} for m in modules()}

def table_parts() -> dict:
    "mixer name -> the modules its table entry names parts in (the table itself imports none of them)."
    from taylor_calibrate.mixers import MIXERS
    paths = lambda m: [getattr(m, f) for f in ('layer', 'shape', 'copy', 'slot_bytes', 'close_gate', 'gauge')] + list(m.phase1.values())
    return {name: {p.partition(':')[0].removeprefix('taylor_calibrate.') for p in paths(m) if isinstance(p, str)} for name, m in MIXERS.items()}

def cycles(graph: dict) -> list:
    "The strongly connected components of more than one module (Tarjan)."
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop(); on.discard(w); comp.add(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index: visit(v)
    return out

def levels(graph: dict) -> dict:
    "Each module's level: 0 if it imports nothing of the package's, else one above the highest module it imports."
    out = {}
    def level(m):
        if m not in out: out[m] = 1 + max((level(d) for d in graph[m]), default=-1)
        return out[m]
    for m in graph: level(m)
    return out

def test_the_levels_list_every_module():
    assert set(LEVEL) == set(modules()), (sorted(set(modules()) - set(LEVEL)), sorted(set(LEVEL) - set(modules())))

def test_no_import_circle():
    "No module imports one that imports it back, however far round, not even inside a function or through the mixer table."
    graph = import_graph()
    assert not cycles(graph), cycles(graph)
    with_table = {**graph, 'mixers': graph['mixers'] | set().union(*table_parts().values())}
    assert not cycles(with_table), cycles(with_table)

def test_each_module_at_its_level():
    "A module sits one above the highest module it imports; the table above says where each one is."
    graph = import_graph()
    got = levels(graph)
    wrong = [f'{m}: level {got[m]} (imports {", ".join(f"{d} ({got[d]})" for d in sorted(graph[m])) or "nothing"}), listed at {LEVEL.get(m)}'
             for m in sorted(graph) if got[m] != LEVEL.get(m)]
    assert not wrong, '\n'.join(wrong)
    print('\n'.join(f'{i}: {", ".join(ms)}' for i, ms in enumerate(LEVELS)))

def test_no_module_imports_a_module_above_it():
    "A lower module never imports a higher one, not even inside a function."
    # convert's `__getattr__` reads the names of the modules next to it through importlib when asked: the one way up, by design
    wrong = [f'{m} (level {LEVEL[m]}) imports {d} (level {LEVEL[d]})' for m, ds in import_graph().items() for d in sorted(ds)
             if LEVEL[d] >= LEVEL[m]]
    assert not wrong, '\n'.join(wrong)

def test_core_holds_the_method_only():
    n = len((ROOT/'taylor_calibrate'/'core.py').read_text().splitlines())
    assert n <= CORE_LINES, f'core.py has {n} lines; at most {CORE_LINES}'

def test_each_mixer_code_in_its_own_modules():
    "The table names every part of a mixer in that mixer's modules; the stages and the method import no mixer's module and never test a mixer's name."
    from taylor_calibrate.mixers import MIXERS
    parts = table_parts()
    assert set(parts) == set(MIXER_MODULES)
    for name, where in parts.items(): assert where <= MIXER_MODULES[name], (name, sorted(where - MIXER_MODULES[name]))
    own = set().union(*MIXER_MODULES.values()) - {'gdn'}
    graph = import_graph()
    wrong = [f'{m} imports {d}' for m in STAGES for d in sorted(graph[m] & own) if not (m == 'core' and d == 'gdn_calibrate')]
    assert not wrong, wrong   # core reads GDN's mappings from gdn_calibrate only to give their old names (CORE_NAMES)
    names = set(MIXERS)
    for m in STAGES:
        tree = ast.parse((ROOT/'taylor_calibrate'/f'{m}.py').read_text())
        hits = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Compare)
                and any(isinstance(x, ast.Constant) and x.value in names for x in [n.left, *n.comparators])]
        assert not hits, (m, hits)
    for name, entry in MIXERS.items():                                 # the objects are where the table says
        for part in ('layer', 'shape', 'copy', 'slot_bytes', 'close_gate', 'gauge'):
            assert entry.part(part).__module__.removeprefix('taylor_calibrate.') in MIXER_MODULES[name], (name, part)

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

HEAVY = {'plotly', 'taylor_calibrate.convert', 'taylor_calibrate.policies', 'taylor_calibrate.export', 'taylor_calibrate.core',
         'taylor_calibrate.gdn_calibrate', 'taylor_calibrate.kda_calibrate', 'taylor_calibrate.mamba2_calibrate'}

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

def test_core_names_are_the_defining_modules_objects():
    "Every name `core` listed is read from it, as the object of the module that defines it now; so are the mixer modules'."
    core = importlib.import_module('taylor_calibrate.core')
    for name in CORE_NAMES:
        home = importlib.import_module(f'taylor_calibrate.{CORE_HOME.get(name, "core")}')
        assert name in home.__dict__ and name in home.__all__, f'{name} is not defined in {home.__name__}'
        assert name in core.__all__ and name in dir(core), name
        assert getattr(core, name) is getattr(home, name), name   # the tunables too: read (and set) through `windows`
    ns = {}
    exec('from taylor_calibrate.core import *', ns)
    assert set(CORE_NAMES) <= set(ns), sorted(set(CORE_NAMES) - set(ns))
    for module, names in MIXER_MODULE_NAMES.items():
        mod = importlib.import_module(f'taylor_calibrate.{module}')
        assert set(names) <= set(mod.__all__), (module, sorted(set(names) - set(mod.__all__)))
        assert all(getattr(mod, n).__module__ == mod.__name__ for n in names), module

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

def test_the_mixer_table_loads_alone():
    "The table imports nothing: the command line's parser and the vLLM plugin read it without torch."
    loaded = loaded_after('import taylor_calibrate.mixers', skip_init=True)
    assert 'torch' not in loaded and not {m for m in loaded if m.startswith('taylor_calibrate.')} - {'taylor_calibrate.mixers'}, sorted(loaded)
