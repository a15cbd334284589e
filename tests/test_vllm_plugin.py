"The vLLM plugin's side outside vLLM: its entry point, what importing it needs, and a registration that never raises."
import importlib.metadata, logging, subprocess, sys
from conftest import ROOT

def _run(code: str):
    return subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=300)

def test_the_entry_point_names_register():
    eps = {e.name: e.value for e in importlib.metadata.entry_points(group='vllm.general_plugins')}
    assert eps.get('taylor_calibrate') == 'taylor_calibrate.vllm_plugin:register', eps

def test_the_plugin_imports_without_the_packages_other_dependencies_inside_vllm():
    # inside vLLM's processes `vllm` is imported first; plotly (and with it the conversion code) may be missing there
    r = _run("import sys, types; sys.modules['plotly'] = None; sys.modules['vllm'] = types.ModuleType('vllm')\n"
             "import taylor_calibrate.vllm_plugin as p\n"
             "assert 'taylor_calibrate.convert' not in sys.modules, 'the conversion code was imported'\n"
             "print(sorted(p.CONFIG_CLASSES))")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split('\n')[0] == "['llama', 'mistral', 'qwen2', 'qwen2_moe', 'qwen3', 'qwen3_moe']"

def test_outside_vllm_a_missing_dependency_is_still_an_error():
    r = _run("import sys; sys.modules['plotly'] = None\nimport taylor_calibrate")
    assert r.returncode != 0 and 'plotly' in r.stderr

def test_register_without_vllm_logs_and_does_not_raise(caplog):
    from taylor_calibrate.vllm_plugin import register
    with caplog.at_level(logging.ERROR): register()
    assert 'registration failed' in caplog.text and 'vllm' in caplog.text
