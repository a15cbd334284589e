__version__ = "0.2.0"
# Importing the package registers the hybrid model types (taylor_calibrate_<teacher type>) with transformers'
# AutoConfig and AutoModelForCausalLM, so that AutoModelForCausalLM.from_pretrained loads saved hybrids.
# The `taylor-calibrate` console script skips it here: --help and argument errors then answer without importing torch,
# and each of its commands imports the conversion code (registering the types) when its work starts (cli._libraries).
import os as _os, sys as _sys

def _in_console_script() -> bool:
    "Whether this process is the `taylor-calibrate` console script (as pip writes it on POSIX and on Windows)."
    script = _os.path.basename((getattr(_sys, 'argv', None) or [''])[0] or '')
    return script.removesuffix('.exe').removesuffix('-script.py') == 'taylor-calibrate'

if not _in_console_script():
    try:
        from . import convert  # noqa: F401
    except ImportError:
        # Inside vLLM's processes only taylor_calibrate.vllm_plugin is needed, and it imports transformers alone: vLLM's
        # environment may lack the package's other dependencies. Anywhere else a failed import stays an error.
        if 'vllm' not in _sys.modules: raise
