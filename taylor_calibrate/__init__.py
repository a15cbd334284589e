__version__ = "0.2.0"
# Importing the package registers the hybrid model types (taylor_calibrate_<teacher type>) with transformers'
# AutoConfig and AutoModelForCausalLM, so that AutoModelForCausalLM.from_pretrained loads saved hybrids.
try:
    from . import convert  # noqa: F401
except ImportError:
    # Inside vLLM's processes only taylor_calibrate.vllm_plugin is needed, and it imports transformers alone: vLLM's
    # environment may lack the package's other dependencies. Anywhere else a failed import stays an error.
    import sys
    if 'vllm' not in sys.modules: raise
