__version__ = "0.2.0"
# Importing the package registers the hybrid model types (taylor_calibrate_<teacher type>) with transformers'
# AutoConfig and AutoModelForCausalLM, so that AutoModelForCausalLM.from_pretrained loads saved hybrids.
from . import convert  # noqa: F401
