"""A toy mixer in one module: per head, a decaying sum of the teacher's values (no keys, no queries), with its copy of the
teacher's attention, its cache slot, its Phase 1 from the targets every mixer shares (and by least squares), its zero gate and its gauge. With one
entry in the mixer table (`taylor_calibrate.mixers.register_mixer`), conversion, calibration, save and load take it.
`tests/test_mixers.py` and the notebook `78_mixers` register it."""
import math
import torch, torch.nn as nn, torch.nn.functional as F
from taylor_calibrate.attention import attention_geometry, copied_projections
from taylor_calibrate.targets import b_dt, beta_star, concentration
from taylor_calibrate.fit import fit_readout


class ToyMixer(nn.Module):
    "Per head h: s_t = exp(g_h) s_{t-1} + beta_h v_t and y_t = W_o s_t, with g_h = -exp(A_log_h) softplus(dt_bias_h), beta_h = sigmoid(b_h)."
    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, layer_idx: int | None = None):
        super().__init__()
        self.hidden_size, self.num_heads, self.head_dim, self.layer_idx = hidden_size, num_heads, head_dim, layer_idx
        self.key_dim = self.value_dim = num_heads * head_dim            # the width a batch of windows is sized by
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)
        self.A_log, self.dt_bias, self.b = (nn.Parameter(torch.zeros(num_heads)) for _ in range(3))

    def gates(self, hidden_states):
        "(beta [B,T,H], g [B,T,H] log-decay), in float32: the same on every token."
        B, T, _ = hidden_states.shape
        beta = torch.sigmoid(self.b.float()).expand(B, T, -1)
        return beta, (-self.A_log.float().exp() * F.softplus(self.dt_bias.float())).expand(B, T, -1)

    def forward(self, hidden_states, attention_mask=None, state=None, use_cache=False):
        "(output [B,T,D], the state {'s': [B,H,d]} with `use_cache`); a padded position leaves the state as it was."
        B, T, _ = hidden_states.shape
        v = self.v_proj(hidden_states).float().view(B, T, self.num_heads, self.head_dim)
        beta, g = self.gates(hidden_states)
        real = torch.ones(B, T, dtype=torch.bool, device=v.device) if attention_mask is None else attention_mask[:, -T:].bool()
        s = v.new_zeros(B, self.num_heads, self.head_dim) if state is None else state['s']
        out = []
        for t in range(T):
            s = torch.where(real[:, t, None, None], g[:, t, :, None].exp() * s + beta[:, t, :, None] * v[:, t], s)
            out.append(s)
        y = self.o_proj(torch.stack(out, 1).flatten(2).to(hidden_states.dtype))
        return y, ({'s': s} if use_cache else None)


def toy_shape(attn: nn.Module) -> dict:
    "One toy head per teacher query head, of its head dim."
    H, _, d = attention_geometry(attn)
    return dict(hidden_size=attn.q_proj.in_features, num_heads=H, head_dim=d)

@torch.no_grad()
def copy_attention_into_toy(attn: nn.Module, layer: ToyMixer, kv_copy: str = 'heads') -> ToyMixer:
    "The teacher's W_V (KV heads repeated per query head) and W_O; the toy has no keys or queries to copy."
    layer.v_proj.weight.copy_(copied_projections(attn, kv_copy)['v_proj'][0])
    layer.o_proj.weight.copy_(attn.o_proj.weight)
    return layer

def toy_slot_bytes(options: dict, batch_size: int = 1, dtype=torch.float32) -> int:
    "Its cache slot holds one float32 sum [B,H,d]."
    return batch_size * options['num_heads'] * options['head_dim'] * 4

@torch.no_grad()
def toy_phase1(layer: ToyMixer, head_stats: dict, x, context, mask, recipe) -> dict:
    "A half-life of d_h tokens and the write strength beta* from the head's entropy, from the shared targets."
    c = concentration(head_stats['entropy'], head_stats['rel_entropy'], recipe.concentration)
    beta = beta_star(c, recipe.beta_lo, recipe.beta_span)
    layer.A_log.zero_()
    layer.dt_bias.copy_(b_dt(head_stats['mean_distance'].clamp_min(0.5)).to(layer.dt_bias))
    layer.b.copy_(torch.logit(beta).to(layer.b))
    return dict(concentration=c, beta_star=beta, dt_bias=layer.dt_bias.detach().clone(), sigma=torch.full_like(beta, math.nan),
                alpha=math.nan)

def toy_fit_phase1(layer: ToyMixer, head_stats: dict, x, context, mask, recipe, target) -> dict:
    "Phase 1 by least squares: `toy_phase1`, then W_O by least squares on what reaches it (`fit_readout`)."
    targets = toy_phase1(layer, head_stats, x, context, mask, recipe)
    fit_readout(layer, x, target, mask)
    return targets

@torch.no_grad()
def close_toy_gate(layer: ToyMixer):
    "The zero-gate baseline: a write strength of sigmoid(-30), about 1e-13, so the sum stays at zero."
    layer.b.fill_(-30.)

@torch.no_grad()
def gauge_toy(layer: ToyMixer, k: torch.Tensor):
    "W_V's rows of head h divided by k_h, W_O's columns multiplied by it."
    H = layer.num_heads
    layer.v_proj.weight.view(H, -1, layer.hidden_size).div_(k[:, None, None].to(layer.v_proj.weight))
    layer.o_proj.weight.view(layer.hidden_size, H, -1).mul_(k[None, :, None].to(layer.o_proj.weight))
