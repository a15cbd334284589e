"""Config classes for saved taylor_calibrate hybrids, and the checks that decide whether this plugin can serve one.

Imports transformers only (no vLLM, no taylor_calibrate), so that every vLLM process can unpickle these classes.
"""
from __future__ import annotations

from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

HYBRID_PREFIX = 'taylor_calibrate_'          # taylor_calibrate.convert.HYBRID_PREFIX
CPU_GDN_HEAD_DIMS = (64, 128)                # taylor_calibrate.convert.VLLM_CPU_GDN_HEAD_DIMS: vLLM 0.32's CPU GDN kernel
SUPPORTED_TEACHERS = ('llama', 'mistral', 'qwen2', 'qwen3')
# teacher types the package converts but this plugin does not serve (yet): registered so that they fail with one line
KNOWN_UNSUPPORTED_TEACHERS = ('qwen2_moe', 'qwen3_moe')
_BASES = {'llama': LlamaConfig, 'mistral': MistralConfig, 'qwen2': Qwen2Config, 'qwen3': Qwen3Config}
_GDN_OPTION_KEYS = ('hidden_size', 'num_heads', 'head_dim', 'expand_v', 'qkv_bias', 'use_short_conv', 'conv_size',
                    'use_gate', 'norm_eps', 'qkv_activation', 'allow_neg_eigval')


def teacher_type(config) -> str | None:
    "The teacher's model type behind a hybrid config ('qwen3' for 'taylor_calibrate_qwen3'), else None."
    mt = getattr(config, 'model_type', None) or ''
    return mt[len(HYBRID_PREFIX):] if mt.startswith(HYBRID_PREFIX) else None


def architecture_name(teacher: str) -> str:
    "The architecture name the package writes for a teacher type: TaylorCalibrate + the teacher's CausalLM class name."
    names = {'llama': 'Llama', 'mistral': 'Mistral', 'qwen2': 'Qwen2', 'qwen3': 'Qwen3', 'qwen2_moe': 'Qwen2Moe',
             'qwen3_moe': 'Qwen3Moe'}
    return f'TaylorCalibrate{names[teacher]}ForCausalLM'


def gdn_geometry(spec: dict) -> dict:
    "Heads, key/value head dims and conv width of the GDN layers, as vLLM's Qwen3.5-style GDN layer takes them."
    o = spec['gdn_options']
    dk = int(o['head_dim'])
    return dict(num_heads=int(o['num_heads']), head_k_dim=dk, head_v_dim=int(dk * float(o.get('expand_v', 1.0))),
                conv_kernel_size=int(o['conv_size']) if o.get('use_short_conv') else 4)


def hybrid_problems(config, on_cpu: bool | None = None, dtype=None) -> list[str]:
    """Why this plugin cannot serve the hybrid of `config` (an empty list: it can), one short phrase each.

    `on_cpu` and `dtype` (the engine's platform and model dtype) add the CPU kernel's limits when given."""
    out = []
    t = teacher_type(config)
    if t is None: return [f'model_type {getattr(config, "model_type", None)!r} is not a taylor_calibrate hybrid']
    if t not in SUPPORTED_TEACHERS:
        return [f'hybrids of {t!r} teachers are not supported (supported teacher types: {", ".join(SUPPORTED_TEACHERS)})']
    spec = getattr(config, 'taylor_calibrate', None)
    if not isinstance(spec, dict) or not isinstance(spec.get('gdn_options'), dict):
        return ['config.json has no taylor_calibrate section with gdn_options']
    if spec.get('format', 1) != 1: out.append(f'taylor_calibrate format {spec.get("format")!r} (this plugin reads format 1)')
    o, L = spec['gdn_options'], config.num_hidden_layers
    if missing := [k for k in ('hidden_size', 'num_heads', 'head_dim') if k not in o]:
        return [f'gdn_options lacks {", ".join(missing)}']
    conv = spec.get('converted_layers')
    if not (isinstance(conv, list) and conv == sorted(set(conv)) and all(isinstance(i, int) and 0 <= i < L for i in conv)):
        out.append(f'converted_layers {conv!r} is not a sorted list of distinct layer indices in 0..{L - 1}')
    if o['hidden_size'] != config.hidden_size: out.append(f'gdn_options hidden_size {o["hidden_size"]} != hidden_size {config.hidden_size}')
    if o.get('allow_neg_eigval'): out.append("allow_neg_eigval=True (beta = 2 sigmoid(b); vLLM's GDN kernels compute beta = sigmoid(b))")
    if o.get('qkv_activation', 'silu') != 'silu':
        out.append(f"qkv_activation {o.get('qkv_activation')!r} (vLLM's GDN layer applies SiLU after its short convolution)")
    g = gdn_geometry(spec)
    if g['head_k_dim'] * float(o.get('expand_v', 1.0)) != g['head_v_dim']: out.append(f'head_dim * expand_v is not an integer')
    if t == 'qwen2':
        hd = getattr(config, 'head_dim', None)
        if hd is not None and hd * config.num_attention_heads != config.hidden_size:
            out.append(f"head_dim {hd} != hidden_size / num_attention_heads (vLLM's Qwen2 attention derives it from the hidden size)")
    if on_cpu:
        bad = sorted({g['head_k_dim'], g['head_v_dim']} - set(CPU_GDN_HEAD_DIMS))
        if bad: out.append(f"GDN head dimension {', '.join(map(str, bad))}: vLLM's CPU GDN kernel takes "
                           f"{' and '.join(map(str, CPU_GDN_HEAD_DIMS))} only (GPU kernels take others)")
        if dtype is not None and str(dtype).removeprefix('torch.') != 'bfloat16':
            out.append(f"dtype {str(dtype).removeprefix('torch.')}: vLLM's CPU GDN kernel runs bfloat16 only (pass --dtype bfloat16)")
    return out


def check_servable(config, on_cpu: bool | None = None, dtype=None) -> None:
    "Raise one ValueError line naming every reason this plugin cannot serve the hybrid of `config`."
    if problems := hybrid_problems(config, on_cpu, dtype):
        src = getattr(config, '_name_or_path', '') or 'this model'
        raise ValueError(f'taylor_calibrate vLLM plugin cannot serve {src}: ' + '; '.join(problems))


def hybrid_layer_types(config) -> list[str]:
    "The teacher's layer types with converted layers as 'linear_attention' (what vLLM reads to treat the model as hybrid)."
    L = config.num_hidden_layers
    spec = getattr(config, 'taylor_calibrate', None) or {}
    conv = set(spec.get('converted_layers') or [])
    base = list(getattr(config, 'layer_types', None) or ['full_attention'] * L)
    if len(base) != L: base = ['full_attention'] * L
    return ['linear_attention' if i in conv else t for i, t in enumerate(base)]


def _make_config_class(teacher: str, base):
    def __post_init__(self, **kwargs):
        base.__post_init__(self, **kwargs)
        spec = getattr(self, 'taylor_calibrate', None)
        if isinstance(spec, dict):
            self.teacher_layer_types = list(getattr(self, 'layer_types', None) or [])
            self.layer_types = hybrid_layer_types(self)
            try: g = gdn_geometry(spec)
            except (KeyError, TypeError, ValueError): return   # hybrid_problems names what is wrong
            # the Qwen3.5 names vLLM's GDN code reads from the model config (e.g. to pick a GPU prefill kernel)
            self.linear_num_key_heads = self.linear_num_value_heads = g['num_heads']
            self.linear_key_head_dim, self.linear_value_head_dim = g['head_k_dim'], g['head_v_dim']
            self.linear_conv_kernel_dim = g['conv_kernel_size']
    return type(f'TaylorCalibrate{base.__name__}', (base,), {
        'model_type': HYBRID_PREFIX + teacher, '__module__': __name__, '__post_init__': __post_init__,
        '__doc__': f"A {teacher} teacher's config with its hybrid's taylor_calibrate section; layer_types marks the GDN layers."})


def _unsupported_base(teacher):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    try: return CONFIG_MAPPING[teacher]
    except KeyError: return None


CONFIG_CLASSES = {}
for _t, _b in _BASES.items():
    CONFIG_CLASSES[_t] = globals()[f'TaylorCalibrate{_b.__name__}'] = _make_config_class(_t, _b)
for _t in KNOWN_UNSUPPORTED_TEACHERS:
    if (_b := _unsupported_base(_t)) is not None:
        CONFIG_CLASSES[_t] = globals()[f'TaylorCalibrate{_b.__name__}'] = _make_config_class(_t, _b)


def register_configs() -> None:
    "Make AutoConfig read taylor_calibrate_<teacher> config.json files (without importing taylor_calibrate)."
    from transformers import AutoConfig
    for t, cls in CONFIG_CLASSES.items():
        AutoConfig.register(cls.model_type, cls, exist_ok=True)
