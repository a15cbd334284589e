"""fla's own Triton kernels, run on the CPU by Triton's interpreter: against our kernel, through our layer's dispatch,
and inside fla's own `GatedDeltaNet` layer loaded with our layer's state dict.

No GPU here, so the branch of `gated_delta_rule` that calls fla's kernels cannot run natively. Triton's interpreter
(`TRITON_INTERPRET=1`, numpy underneath) runs the same kernel source on CPU tensors, given two shims for this
machine: the autotuner may not time its configurations (no driver: every configuration ties, the first is used),
and a kernel's `range(...)` must yield Triton scalars (the interpreter hands out Python ints, on which fla's
kernels call `.to`). The interpreter must be switched on before Triton compiles anything, so the checks run in a
fresh interpreter (`python tests/test_fla_interpreted.py` prints them as JSON) and the test asserts on the result.
"""
import json, os, subprocess, sys
from pathlib import Path
import pytest

pytest.importorskip('fla')


def rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _shim_triton():
    "Make fla's kernels runnable under the interpreter on a machine without a GPU driver (see the module docstring)."
    import builtins, triton.language as tl, triton.runtime.autotuner as autotuner
    autotuner.Autotuner._bench = lambda self, *a, **kw: [0.0, 0.0, 0.0]
    def scalar(a): return int(a.handle.data.item()) if hasattr(a, 'handle') else int(getattr(a, 'value', a))
    def tl_range(*args):
        for i in builtins.range(*map(scalar, args)): yield tl.full((), i, tl.int32)
    import fla.ops.gated_delta_rule  # noqa: F401  (imports every kernel module we patch below)
    for name, mod in list(sys.modules.items()):
        if name.startswith('fla.ops') and mod is not None: mod.range = tl_range


def kernel_checks():
    "fla's chunk kernel (forward and backward) and fused recurrent kernel vs `chunk_gated_delta_rule_torch`."
    import torch
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    from taylor_calibrate.gdn import chunk_gated_delta_rule_torch, l2norm
    out = {}
    for case, (T, gscale, bshift) in {'T=100': (100, 1.0, 0.0), 'extreme gates': (70, 30.0, 0.0),
                                      'beta near 0 and 1': (70, 1.0, 8.0)}.items():
        gen = torch.Generator().manual_seed(len(case))
        q, k = (l2norm(torch.randn(1, T, 2, 16, generator=gen)) for _ in range(2))
        v = torch.randn(1, T, 2, 16, generator=gen)
        g = -gscale * torch.rand(1, T, 2, generator=gen)
        beta = torch.sigmoid(torch.randn(1, T, 2, generator=gen) + bshift * torch.tensor([1.0, -1.0]))
        S0 = torch.randn(1, 2, 16, 16, generator=gen)
        res = {}
        for name, f in (('fla', lambda *a: chunk_gated_delta_rule(*a[:5], initial_state=a[5], output_final_state=True)),
                        ('ours', lambda *a: chunk_gated_delta_rule_torch(*a[:5], initial_state=a[5], output_final_state=True))):
            xs = [t.clone().requires_grad_() for t in (q, k, v, g, beta, S0)]
            o, S = f(*xs)
            (o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum().add((S * S).sum()).backward()
            res[name] = dict(o=o, S=S, **{f'd{n}': t.grad for n, t in zip(('q', 'k', 'v', 'g', 'beta', 'S0'), xs)})
        out[case] = {n: rel(res['fla'][n], res['ours'][n]) for n in res['ours']}
    with torch.no_grad():   # one decoding step from a carried state
        q, k, v = torch.randn(3, 1, 1, 2, 16).unbind(0)
        g, beta, S0 = -torch.rand(1, 1, 2), torch.rand(1, 1, 2), torch.randn(1, 2, 16, 16)
        o1, S1 = fused_recurrent_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=S0, output_final_state=True)
        o2, S2 = chunk_gated_delta_rule_torch(q, k, v, g, beta, initial_state=S0, output_final_state=True)
        out['one recurrent step'] = dict(o=rel(o1, o2), S=rel(S1, S2))
    return out


def layer_checks():
    "Our GatedDeltaNet with its dispatch forced to fla's kernels vs the same layer on our kernel: padded batch, grads, decoding."
    import torch
    import taylor_calibrate.gdn as gdn
    torch.manual_seed(0)
    layer = gdn.GatedDeltaNet(64, 2, 32, use_short_conv=True, qkv_bias=True)
    x = torch.randn(2, 90, 64)
    mask = torch.ones(2, 90, dtype=torch.long); mask[1, :23] = 0
    res, available = {}, gdn.fla_kernels_available
    try:
        for name, fla in (('fla', True), ('ours', False)):
            gdn.fla_kernels_available = lambda device=None, fla=fla: fla
            layer.zero_grad(); xi = x.clone().requires_grad_()
            y, _ = layer(xi, mask)
            (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
            with torch.no_grad():
                y0, st = layer(x[:1, :80], use_cache=True)
                steps = [y0] + [None] * 10
                for t in range(80, 90): steps[t - 79], st = layer(x[:1, t:t + 1], state=st, use_cache=True)
            res[name] = dict(y=y, dx=xi.grad, decode=torch.cat(steps, 1),
                             **{f'd{n}': p.grad.clone() for n, p in layer.named_parameters()})
    finally:
        gdn.fla_kernels_available = available
    return {n: rel(res['fla'][n], res['ours'][n]) for n in res['ours']}


def fla_layer_checks():
    "fla's own `GatedDeltaNet` layer loaded with our layer's state dict (every parameter perturbed): outputs and gradients."
    import warnings, torch
    import fla.layers
    from taylor_calibrate.gdn import GatedDeltaNet
    out = {}
    for cfg in (dict(), dict(use_short_conv=True), dict(use_gate=False), dict(allow_neg_eigval=True)):
        torch.manual_seed(0)
        ours = GatedDeltaNet(64, 2, 32, **cfg)
        with torch.no_grad():
            for p in ours.parameters(): p.add_(0.3 * torch.randn_like(p))
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            theirs = fla.layers.GatedDeltaNet(hidden_size=64, num_heads=2, head_dim=32, **(dict(expand_v=1.0, use_short_conv=False) | cfg))
        theirs.load_state_dict(ours.state_dict())
        x, res = torch.randn(2, 90, 64), {}
        for name, layer in (('fla', theirs), ('ours', ours)):
            xi = x.clone().requires_grad_()
            y = layer(xi)[0]
            (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
            res[name] = dict(y=y, dx=xi.grad, **{f'd{n}': p.grad for n, p in layer.named_parameters()})
        out[','.join(f'{k}={v}' for k, v in cfg.items()) or 'default'] = {n: rel(res['fla'][n], res['ours'][n]) for n in res['ours']}
    return out


def test_fla_kernels_interpreted_agree_with_ours(root):
    env = dict(os.environ, TRITON_INTERPRET='1', PYTHONWARNINGS='ignore')
    r = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=900, env=env, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for case, errs in res['kernel'].items():
        for name, e in errs.items(): assert e < 1e-4, (case, name, e)
    for name, e in res['layer'].items(): assert e < 1e-4, (name, e)
    for cfg, errs in res['fla_layer'].items():
        for name, e in errs.items(): assert e < 1e-4, (cfg, name, e)
    assert len(res['fla_layer']) == 4 and 'dq_conv1d.weight' in res['fla_layer']['use_short_conv=True']
    assert 'decode' in res['layer'] and 'dA_log' in res['layer'] and 'dq_conv1d.weight' in res['layer']


if __name__ == '__main__':
    assert os.environ.get('TRITON_INTERPRET') == '1', 'run with TRITON_INTERPRET=1'
    _shim_triton()
    print(json.dumps(dict(kernel=kernel_checks(), layer=layer_checks(), fla_layer=fla_layer_checks())))
