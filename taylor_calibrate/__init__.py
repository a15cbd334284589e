__version__ = "0.2.0"
# Importing the package imports neither torch nor transformers. The hybrid config types (taylor_calibrate_<teacher type>)
# are registered with transformers' AutoConfig when transformers' auto classes load (at once if they already have), and
# the first hybrid config made registers the hybrid model classes with AutoModelForCausalLM (taylor_calibrate.hybrid), so
# that AutoConfig and AutoModelForCausalLM.from_pretrained read saved hybrids after a plain `import taylor_calibrate`.
# Inside vLLM's processes the plugin (taylor_calibrate.vllm_plugin) registers its own config classes for these model
# types, and nothing is registered here.
import importlib.abc as _abc, importlib.machinery as _machinery, sys as _sys

# transformers' auto and config modules import each other (a config class's docstring decorator imports modeling_auto),
# so the types are registered when the outermost of them has run, never while one of them is half-imported.
_AUTO_CONFIG = 'transformers.models.auto.configuration_auto'
_running: set = set()
_registered = False

def _watched(name: str) -> bool:
    "transformers' auto modules and every model's configuration module."
    return name.startswith('transformers.models.') and name.rsplit('.', 1)[-1].startswith(('configuration_', 'modeling_auto'))

def _register() -> None:
    "Register the hybrid config types, unless this is a vLLM process; a failure is one warning, not a failed import."
    global _registered
    if _registered or 'vllm' in _sys.modules: return
    _running.add('registration')        # the config modules it imports load modeling_auto: no registration inside this one
    try:
        from .hybrid import register_hybrid_configs
        register_hybrid_configs()
        _registered = True
    except Exception as e:
        import warnings
        warnings.warn(f'taylor_calibrate: the hybrid model types are not registered with transformers ({type(e).__name__}: {e})')
    finally: _running.discard('registration')

class _RegisterAfterImport(_abc.MetaPathFinder):
    "Finds transformers' auto and config modules as usual, and registers the hybrid config types once the outermost has run."
    def find_spec(self, name, path, target=None):
        if _registered or not _watched(name): return None
        spec = _machinery.PathFinder.find_spec(name, path, target)
        if spec is None or not hasattr(spec.loader, 'exec_module'): return spec
        run = spec.loader.exec_module
        def exec_module(module):
            _running.add(name)
            try: run(module)
            finally: _running.discard(name)
            if not _running and _AUTO_CONFIG in _sys.modules: _register()
        spec.loader.exec_module = exec_module
        return spec

if _AUTO_CONFIG in _sys.modules: _register()
if not any(isinstance(f, _RegisterAfterImport) for f in _sys.meta_path): _sys.meta_path.insert(0, _RegisterAfterImport())
