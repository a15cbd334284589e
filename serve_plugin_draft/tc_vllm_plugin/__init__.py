"""A vLLM general plugin serving directories written by taylor_calibrate's `save_hybrid` (no export step).

`register()` is the `vllm.general_plugins` entry point. vLLM calls it in every process (API server, engine core,
workers), possibly several times. It
  1. registers the hybrid config classes (`taylor_calibrate_<teacher>`) with transformers' AutoConfig, which vLLM
     uses to read config.json (this needs transformers only: `taylor_calibrate` itself is never imported);
  2. registers the architectures `TaylorCalibrate{Qwen2,Qwen3,Llama,Mistral}ForCausalLM` (and, to fail with one line,
     the MoE ones the package writes but this plugin does not serve) with `vllm.ModelRegistry`, lazily;
  3. adds a per-architecture config hook (vLLM's MODELS_CONFIG_MAP, as in-tree hybrids do) that refuses a hybrid this
     plugin cannot serve before the engine starts, with one line naming the reason, and keeps the GDN recurrent state
     in float32 (as the package does) unless --mamba-ssm-cache-dtype says otherwise.
"""
from __future__ import annotations

__version__ = '0.0.1'

SERVED = ('qwen2', 'qwen3', 'llama', 'mistral')
REFUSED = ('qwen2_moe', 'qwen3_moe')


def _config_hook():
    from vllm.logger import init_logger
    logger = init_logger(f'vllm.{__name__}')
    from vllm.model_executor.models.config import VerifyAndUpdateConfig
    from vllm.platforms import current_platform
    from .config import check_servable

    class TaylorCalibrateHybridConfig(VerifyAndUpdateConfig):
        @staticmethod
        def verify_and_update_model_config(model_config) -> None:
            check_servable(model_config.hf_config, on_cpu=current_platform.is_cpu(), dtype=model_config.dtype)

        @staticmethod
        def verify_and_update_config(vllm_config) -> None:
            cc = vllm_config.cache_config
            if cc.mamba_ssm_cache_dtype == 'auto':
                cc.mamba_ssm_cache_dtype = 'float32'
                logger.info('taylor_calibrate vLLM plugin: GDN recurrent state kept in float32, as the package keeps it '
                            '(--mamba-ssm-cache-dtype overrides)')
    return TaylorCalibrateHybridConfig


def register() -> None:
    "The entry point: never raises (vLLM does not guard general plugins, and a failure would stop every vLLM start)."
    try: _register()
    except Exception:
        import logging
        logging.getLogger(__name__).exception('taylor_calibrate vLLM plugin: registration failed; hybrids will not load')


def _register() -> None:
    from vllm import ModelRegistry
    from .config import architecture_name, register_configs
    register_configs()
    hook = None
    try:
        from vllm.model_executor.models.config import MODELS_CONFIG_MAP
        hook = _config_hook()
    except ImportError:   # another vLLM layout: the checks still run when the model is built
        MODELS_CONFIG_MAP = None
    for t in (*SERVED, *REFUSED):
        arch = architecture_name(t)
        if arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(arch, f'{__name__}.model:{arch}')   # relocatable
        if MODELS_CONFIG_MAP is not None: MODELS_CONFIG_MAP.setdefault(arch, hook)
