"""The package's GatedDeltaNet as vLLM's Qwen3.5 GDN layer, with the package's separate projections fused at load time.

taylor_calibrate.gdn.GatedDeltaNet (fla's parameterisation) computes, per head h of H (key/value GQA heads already
repeated to H at conversion):

    q, k, v = act(conv(W_q x + b_q)), act(conv(W_k x + b_k)), act(conv(W_v x + b_v))   # conv: optional short conv
    q, k = l2norm(q), l2norm(k);  q *= head_dim ** -0.5
    beta = sigmoid(W_b x);  g = -exp(A_log) * softplus(W_a x + dt_bias)
    o = gated delta rule(q, k, v, g, beta)
    y = W_o (RMSNorm(o) * o_norm.weight * silu(W_g x))                                 # fla's FusedRMSNormGated

vLLM's `QwenGatedDeltaNetAttention` (Qwen3-Next / Qwen3.5, non-interleaved layout) computes the same with fused
projections: in_proj_qkvz = [W_q; W_k; W_v; W_g], in_proj_ba = [W_b; W_a], a depthwise causal conv1d over [q; k; v]
followed by SiLU (always present: an identity kernel when the hybrid has no short convolution), the same gates, and
RMSNormGated(norm_before_gate=True, silu). It runs on CPU (`forward_cpu` -> `cpu_gdn_attention_core`) and on GPU
(`forward_cuda` -> fla/FlashInfer kernels), so this layer only adapts construction and weight names:

  * q/k/v biases (qkv_bias, Qwen2 teachers): in_proj_qkvz gets a bias, the z (gate) part of it zero;
  * the output norm's eps is the GDN's norm_eps, not the teacher's rms_norm_eps;
  * use_gate=False: plain RMSNorm (z ignored; its rows are loaded as zeros and never used).
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from vllm.model_executor.layers.linear import MergedColumnParallelLinear
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

from .config import gdn_geometry

# the package's per-layer tensor names (under model.layers.i.self_attn.gdn.) -> (vLLM parameter, shard id)
FUSED = {'q_proj': ('in_proj_qkvz', 0), 'k_proj': ('in_proj_qkvz', 1), 'v_proj': ('in_proj_qkvz', 2),
         'g_proj': ('in_proj_qkvz', 3), 'b_proj': ('in_proj_ba', 0), 'a_proj': ('in_proj_ba', 1)}
RENAMED = {'A_log': 'A_log', 'dt_bias': 'dt_bias', 'o_norm.weight': 'norm.weight', 'o_proj.weight': 'out_proj.weight'}
CONVS = ('q_conv1d.weight', 'k_conv1d.weight', 'v_conv1d.weight')


def gdn_layer_config(spec: dict) -> SimpleNamespace:
    "The Qwen3.5-style config fields vLLM's GDN layer reads, from a hybrid's taylor_calibrate section."
    o, g = spec['gdn_options'], gdn_geometry(spec)
    return SimpleNamespace(
        hidden_size=o['hidden_size'], hidden_act='silu', rms_norm_eps=o.get('norm_eps', 1e-5), output_gate_type='silu',
        linear_num_key_heads=g['num_heads'], linear_num_value_heads=g['num_heads'], linear_key_head_dim=g['head_k_dim'],
        linear_value_head_dim=g['head_v_dim'], linear_conv_kernel_dim=g['conv_kernel_size'])


def expected_checkpoint_names(spec: dict) -> list[str]:
    "The tensors a converted layer's `self_attn.gdn.` holds in a saved hybrid."
    o = spec['gdn_options']
    names = [f'{p}.weight' for p in ('q_proj', 'k_proj', 'v_proj', 'a_proj', 'b_proj', 'o_proj')] + ['A_log', 'dt_bias', 'o_norm.weight']
    if o.get('qkv_bias'): names += ['q_proj.bias', 'k_proj.bias', 'v_proj.bias']
    if o.get('use_gate', True): names.append('g_proj.weight')
    if o.get('use_short_conv'): names += list(CONVS)
    return names


class TaylorCalibrateGatedDeltaNet(QwenGatedDeltaNetAttention):
    "vLLM's Qwen3.5 GDN layer built from a hybrid's gdn_options (see the module docstring)."

    def __init__(self, spec: dict, vllm_config, prefix: str = ''):
        o = spec['gdn_options']
        self._qkv_bias, self._use_gate = bool(o.get('qkv_bias')), bool(o.get('use_gate', True))
        self._use_short_conv = bool(o.get('use_short_conv'))
        super().__init__(gdn_layer_config(spec), vllm_config, prefix=prefix, gqa_interleaved_layout=False)

    def create_qkvz_proj(self, hidden_size, key_dim, value_dim, quant_config, prefix):
        proj = MergedColumnParallelLinear(input_size=hidden_size, output_sizes=[key_dim, key_dim, value_dim, value_dim],
                                          bias=self._qkv_bias, quant_config=quant_config, prefix=prefix)
        if proj.bias is not None:
            with torch.no_grad(): proj.bias.zero_()   # the gate's part stays zero; q/k/v parts are loaded
        return proj

    def _output_projection(self, core_attn_out, z):
        return super()._output_projection(core_attn_out, z if self._use_gate else None)

    # ---- weights: checkpoint tensors of one layer -> this layer's fused parameters

    def synthetic_tensors(self) -> dict:
        "Tensors the package does not store but this layer needs: identity conv, zero gate rows/bias (full, unsharded shapes)."
        dev = self.in_proj_qkvz.weight.device
        out = {}
        if not self._use_short_conv:
            w = torch.zeros(self.conv_dim, 1, self.conv_kernel_size, dtype=torch.float32, device=dev)
            w[:, 0, -1] = 1.0   # causal depthwise conv whose output is its current input
            out['conv1d.weight'] = (w, None)
        if not self._use_gate:
            out['in_proj_qkvz.weight#3'] = (torch.zeros(self.value_dim, self.hidden_size, device=dev), 3)
        if self._qkv_bias:
            out['in_proj_qkvz.bias#3'] = (torch.zeros(self.value_dim, device=dev), 3)
        return out

    def load_gdn_tensors(self, tensors: dict[str, torch.Tensor]) -> set[str]:
        "Load one converted layer's tensors (names as under `self_attn.gdn.`); returns the vLLM parameter names filled."
        params = dict(self.named_parameters())
        loaded = set()
        def put(name, w, shard=None):
            p = params[name]
            loader = getattr(p, 'weight_loader', None)
            if loader is None:
                from vllm.model_executor.model_loader.weight_utils import default_weight_loader
                loader = default_weight_loader
            loader(p, w) if shard is None else loader(p, w, shard)
            loaded.add(name)
        for n, w in tensors.items():
            head, _, leaf = n.rpartition('.')
            if head in FUSED:
                target, shard = FUSED[head]
                put(f'{target}.{leaf}', w, shard)
            elif n in RENAMED: put(RENAMED[n], w)
        if self._use_short_conv:
            put('conv1d.weight', torch.cat([tensors[c] for c in CONVS], 0))
        for key, (w, shard) in self.synthetic_tensors().items():
            put(key.split('#')[0], w, shard)
        return loaded
