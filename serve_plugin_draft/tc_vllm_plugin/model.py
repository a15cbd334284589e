"""vLLM model classes for saved taylor_calibrate hybrids: the teacher family's own vLLM decoder layers where attention
was kept, `TaylorCalibrateGatedDeltaNet` (vLLM's Qwen3.5 GDN layer) where it was converted.

Weight names are those `save_hybrid` writes (the teacher's, plus `model.layers.i.self_attn.gdn.*` in converted layers);
loading maps them onto vLLM's fused parameters and refuses missing or unexpected tensors with one line.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import islice
from typing import ClassVar

import torch
from torch import nn

from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group
from vllm.logger import init_logger
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.mamba.mamba_utils import (MambaStateCopyFuncCalculator, MambaStateDtypeCalculator,
                                                           MambaStateShapeCalculator)
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid
from vllm.model_executor.models.utils import AutoWeightsLoader, extract_layer_index, make_layers, maybe_prefix
from vllm.platforms import current_platform
from vllm.sequence import IntermediateTensors

from .config import check_servable, gdn_geometry, teacher_type
from .gdn import TaylorCalibrateGatedDeltaNet, expected_checkpoint_names

logger = init_logger(f'vllm.{__name__}')   # under 'vllm': vLLM's log handlers show it


# ---------------------------------------------------------------------------------------------- teacher families

def _family(teacher: str):
    "(kept decoder layer factory, MLP factory) of vLLM's own implementation of a teacher family."
    if teacher in ('qwen2', 'qwen3'):
        if teacher == 'qwen2':
            from vllm.model_executor.models.qwen2 import Qwen2DecoderLayer as Layer, Qwen2MLP as MLP
        else:
            from vllm.model_executor.models.qwen3 import Qwen3DecoderLayer as Layer, Qwen3MLP as MLP
        def layer(config, vc, prefix):
            return Layer(config=config, cache_config=vc.cache_config, quant_config=vc.quant_config, prefix=prefix)
        def mlp(config, vc, prefix):
            return MLP(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size, hidden_act=config.hidden_act,
                       quant_config=vc.quant_config, prefix=prefix)
        return layer, mlp
    if teacher in ('llama', 'mistral'):
        if teacher == 'llama':
            from vllm.model_executor.models.llama import LlamaDecoderLayer as Layer, LlamaMLP as MLP
        else:
            from vllm.model_executor.models.mistral import MistralDecoderLayer as Layer, MistralMLP as MLP
        def layer(config, vc, prefix):
            return Layer(vllm_config=vc, prefix=prefix, config=config)
        def mlp(config, vc, prefix):
            return MLP(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size, hidden_act=config.hidden_act,
                       quant_config=vc.quant_config, bias=getattr(config, 'mlp_bias', False), prefix=prefix)
        return layer, mlp
    raise ValueError(f'taylor_calibrate vLLM plugin: no vLLM family for teacher type {teacher!r}')


class TaylorCalibrateGDNDecoderLayer(nn.Module):
    "A converted layer: the teacher's norms and MLP around the GDN layer (same residual flow as vLLM's Qwen2/Llama layers)."

    def __init__(self, config, vllm_config: VllmConfig, prefix: str, mlp_factory):
        super().__init__()
        self.self_attn = TaylorCalibrateGatedDeltaNet(config.taylor_calibrate, vllm_config, prefix=f'{prefix}.self_attn')
        self.mlp = mlp_factory(config, vllm_config, f'{prefix}.mlp')
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


# ---------------------------------------------------------------------------------------------- the model

_GDN_NAME = re.compile(r'^layers\.(\d+)\.self_attn\.gdn\.(.+)$')
_STACKED = (('.qkv_proj', '.q_proj', 'q'), ('.qkv_proj', '.k_proj', 'k'), ('.qkv_proj', '.v_proj', 'v'),
            ('.gate_up_proj', '.gate_proj', 0), ('.gate_up_proj', '.up_proj', 1))


@support_torch_compile(dynamic_arg_dims={'input_ids': 0, 'positions': -1, 'intermediate_tensors': 0, 'inputs_embeds': 0})
class TaylorCalibrateModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ''):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.converted = set(config.taylor_calibrate['converted_layers'])
        kept_layer, mlp = _family(teacher_type(config))
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, quant_config=vllm_config.quant_config,
                                                   prefix=f'{prefix}.embed_tokens')
        def get_layer(prefix: str):
            if extract_layer_index(prefix) in self.converted:
                return TaylorCalibrateGDNDecoderLayer(config, vllm_config, prefix, mlp)
            return kept_layer(config, vllm_config, prefix)
        self.start_layer, self.end_layer, self.layers = make_layers(config.num_hidden_layers, get_layer, prefix=f'{prefix}.layers')
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: IntermediateTensors | None = None, inputs_embeds: torch.Tensor | None = None):
        hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        residual = None
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        spec, where = self.config.taylor_calibrate, getattr(self.config, '_name_or_path', '') or 'the checkpoint'
        expected = set(expected_checkpoint_names(spec))
        params = dict(self.named_parameters())
        gdn = {i: {} for i in self.converted}
        loaded, unexpected = set(), []
        for name, w in weights:
            if 'rotary_emb.inv_freq' in name: continue
            if m := _GDN_NAME.match(name):
                i, rest = int(m[1]), m[2]
                if i in gdn and rest in expected: gdn[i][rest] = w
                else: unexpected.append(f'model.{name}')
                continue
            for param_name, weight_name, shard in _STACKED:
                if weight_name in name and name.replace(weight_name, param_name) in params:
                    target = name.replace(weight_name, param_name)
                    params[target].weight_loader(params[target], w, shard)
                    break
            else:
                target = name
                if target not in params: unexpected.append(f'model.{name}'); continue
                getattr(params[target], 'weight_loader', default_weight_loader)(params[target], w)
            loaded.add(target)
        missing = [f'model.layers.{i}.self_attn.gdn.{n}' for i, t in gdn.items() for n in sorted(expected - set(t))]
        if unexpected or missing:
            raise ValueError(f'taylor_calibrate vLLM plugin: the tensors of {where} do not fit its config ('
                             + '; '.join(f'{k}: {v[:4]}' for k, v in (('unexpected', unexpected), ('missing', missing)) if v) + ')')
        for i, tensors in gdn.items():
            loaded |= {f'layers.{i}.self_attn.{n}' for n in self.layers[i].self_attn.load_gdn_tensors(tensors)}
        return loaded


class _TaylorCalibrateForCausalLM(nn.Module, HasInnerState, IsHybrid):
    "A saved taylor_calibrate hybrid of a `teacher` teacher."
    teacher: ClassVar[str] = ''
    packed_modules_mapping = {'qkv_proj': ['q_proj', 'k_proj', 'v_proj'], 'gate_up_proj': ['gate_proj', 'up_proj'],
                              'in_proj_qkvz': ['q_proj', 'k_proj', 'v_proj', 'g_proj'], 'in_proj_ba': ['b_proj', 'a_proj']}

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ''):
        super().__init__()
        config = vllm_config.model_config.hf_config
        check_servable(config, on_cpu=current_platform.is_cpu(), dtype=vllm_config.model_config.dtype)
        if get_pp_group().world_size > 1: raise ValueError('taylor_calibrate vLLM plugin: pipeline parallelism is not supported')
        self.config, self.vllm_config = config, vllm_config
        self.model = TaylorCalibrateModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, 'model'))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, quant_config=vllm_config.quant_config,
                                      prefix=maybe_prefix(prefix, 'lm_head'))
        if config.tie_word_embeddings: self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)
        g, conv = gdn_geometry(config.taylor_calibrate), config.taylor_calibrate['converted_layers']
        logger.info('taylor_calibrate vLLM plugin: %s: attention layers %s (vLLM %s), GDN layers %s (%d heads, key/value '
                    'head dims %d/%d, %s)', type(self).__name__,
                    [i for i in range(config.num_hidden_layers) if i not in set(conv)],
                    type(next((l for i, l in enumerate(self.model.layers) if i not in set(conv)), None)).__name__, conv,
                    g['num_heads'], g['head_k_dim'], g['head_v_dim'],
                    'short conv' if config.taylor_calibrate['gdn_options'].get('use_short_conv') else 'identity conv')

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights)   # a tied lm_head is an alias it skips

    # ---- the GDN state vLLM allocates per sequence (conv tail + recurrent state), as for Qwen3.5

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig) -> tuple[torch.dtype, torch.dtype]:
        cc = vllm_config.cache_config
        return MambaStateDtypeCalculator.gated_delta_net_state_dtype(vllm_config.model_config.dtype, cc.mamba_cache_dtype,
                                                                      cc.mamba_ssm_cache_dtype)

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig):
        g = gdn_geometry(vllm_config.model_config.hf_config.taylor_calibrate)
        spec = vllm_config.speculative_config
        return MambaStateShapeCalculator.gated_delta_net_state_shape(
            vllm_config.parallel_config.tensor_parallel_size, g['num_heads'], g['num_heads'], g['head_k_dim'], g['head_v_dim'],
            g['conv_kernel_size'], spec.num_speculative_tokens if spec else 0)

    @classmethod
    def get_mamba_state_copy_func(cls):
        return MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()


class TaylorCalibrateQwen2ForCausalLM(_TaylorCalibrateForCausalLM): teacher = 'qwen2'
class TaylorCalibrateQwen3ForCausalLM(_TaylorCalibrateForCausalLM): teacher = 'qwen3'
class TaylorCalibrateLlamaForCausalLM(_TaylorCalibrateForCausalLM): teacher = 'llama'
class TaylorCalibrateMistralForCausalLM(_TaylorCalibrateForCausalLM): teacher = 'mistral'


class TaylorCalibrateUnsupportedForCausalLM(_TaylorCalibrateForCausalLM):
    "Registered for hybrid types the package writes but this plugin cannot serve: construction fails with one line."
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ''):
        nn.Module.__init__(self)
        check_servable(vllm_config.model_config.hf_config)
        raise ValueError('taylor_calibrate vLLM plugin: unsupported hybrid type')


class TaylorCalibrateQwen2MoeForCausalLM(TaylorCalibrateUnsupportedForCausalLM): teacher = 'qwen2_moe'
class TaylorCalibrateQwen3MoeForCausalLM(TaylorCalibrateUnsupportedForCausalLM): teacher = 'qwen3_moe'
