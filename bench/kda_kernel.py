"""One forward and backward of KDA's chunked CPU kernel against GDN's, side by side, at the layer shapes of the shipped
teachers and of SmolLM2-135M: what a Phase-2 step of a KDA layer costs beside a GDN layer's, in the recurrence alone.

Both kernels get the same q, k, v and write strengths on 2 windows of 512 tokens (the paper's 1,024 calibration tokens);
KDA a log-decay per key channel, GDN one per head. The runs alternate (GDN, KDA, GDN, ...) so both see the same machine,
and the medians and their ratio are reported.

Run: `python bench/kda_kernel.py` (about a minute; writes bench/results/kda_kernel.json). The `load_before` it records
says whether the machine was otherwise idle.
"""
import json, os, platform, statistics, time
from pathlib import Path
import torch, torch.nn.functional as F
from taylor_calibrate.gdn import chunk_gated_delta_rule_torch
from taylor_calibrate.kda import chunk_kda_torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT/'bench'/'results'/'kda_kernel.json'
SHAPES = {'tiny-qwen2 / tiny-qwen3': dict(heads=8, head_dim=32), 'smollm2-135m': dict(heads=9, head_dim=64)}
WINDOWS, SEQ_LEN, REPS = 2, 512, 7

def step_seconds(kernel, q, k, v, g, beta) -> float:
    "Wall seconds of the kernel's forward and the backward of a squared-sum loss through it."
    leaves = [t.detach().requires_grad_() for t in (q, k, v, g, beta)]
    t0 = time.perf_counter()
    o, _ = kernel(F.normalize(leaves[0], dim=-1), F.normalize(leaves[1], dim=-1), *leaves[2:])
    o.square().sum().backward()
    return time.perf_counter() - t0

def main():
    torch.set_num_threads(1)
    out = dict(machine=platform.processor() or platform.machine(), torch=torch.__version__, threads=1, windows=WINDOWS, seq_len=SEQ_LEN,
               reps=REPS, load_before=os.getloadavg()[0], shapes={})
    for name, s in SHAPES.items():
        gen = torch.Generator().manual_seed(0)
        B, T, H, K = WINDOWS, SEQ_LEN, s['heads'], s['head_dim']
        q, k, v = (torch.randn(B, T, H, K, generator=gen) for _ in range(3))
        beta = torch.rand(B, T, H, generator=gen)
        g_channel = -F.softplus(torch.randn(B, T, H, K, generator=gen))
        g_head = g_channel.mean(-1)
        times = {'gdn': [], 'kda': []}
        step_seconds(chunk_gated_delta_rule_torch, q, k, v, g_head, beta); step_seconds(chunk_kda_torch, q, k, v, g_channel, beta)   # warm-up
        for _ in range(REPS):
            times['gdn'].append(step_seconds(chunk_gated_delta_rule_torch, q, k, v, g_head, beta))
            times['kda'].append(step_seconds(chunk_kda_torch, q, k, v, g_channel, beta))
        med = {n: statistics.median(t) for n, t in times.items()}
        out['shapes'][name] = dict(**s, seconds=times, median_s=med, kda_over_gdn=med['kda'] / med['gdn'])
        print(f"{name}: GDN {med['gdn'] * 1e3:.0f} ms, KDA {med['kda'] * 1e3:.0f} ms per forward and backward ({med['kda'] / med['gdn']:.1f}x)", flush=True)
    RESULTS.write_text(json.dumps(out, indent=1)); print('wrote', RESULTS)

if __name__ == '__main__': main()
