"""Where one Phase-2 step's time goes, at SmolLM2-135M's layer shape: the projections, the recurrence, the rest.

A Phase-2 step is one forward and backward of a GDN layer on the calibration windows (`windows.mse_backward`, the
function Phase 2 calls). This profiles that step on one thread with `torch.profiler` and splits its CPU time into
- projections: the layer's linear maps (W_Q, W_K, W_V, the output gate's W_G, W_O, and the two small gate maps a and b),
  forward (`aten::linear`) and backward (`MmBackward0`);
- recurrence: the chunked gated delta rule, forward (`_ChunkGatedDeltaRule`) and its hand-written backward;
- the rest: activations, L2 norms, the gated RMSNorm, the loss.
It also reports the projections' arithmetic rate (their multiply-adds over their time), which says how close the
largest part runs to what this CPU's matrix multiply gives, and times the same matrix products alone, side by side.

Run: `python bench/phase2_step_parts.py` (about a minute; writes bench/results/phase2_step_parts_smollm2-135m.json).
Run it on an otherwise idle machine: the `load_before` it records says whether it was.
"""
import json, os, platform, statistics, time
from pathlib import Path
import torch
from taylor_calibrate.gdn import GatedDeltaNet
from taylor_calibrate.windows import mse_backward

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT/'bench'/'results'/'phase2_step_parts_smollm2-135m.json'
SHAPE = dict(hidden_size=576, num_heads=9, head_dim=64)       # SmolLM2-135M: width 576, 9 query heads of dimension 64
WINDOWS = {'taylor': 2, 'taylor+': 4}                          # windows of 512 tokens a step
SEQ_LEN, STEPS = 512, 9
PARTS = {'projections': ('aten::linear', 'MmBackward0'), 'recurrence': ('_ChunkGatedDeltaRule', '_ChunkGatedDeltaRuleBackward')}

def projection_flops(gdn, tokens: int) -> float:
    """Floating-point operations of the layer's linear maps in one step, 2 per multiply-add: forward every map; backward
    the weight gradients of the trained maps and the input gradient of W_O (the inputs need none; W_O is frozen in Phase 2)."""
    maps = [gdn.q_proj, gdn.k_proj, gdn.v_proj, gdn.g_proj, gdn.a_proj, gdn.b_proj]
    per_token = sum(m.weight.numel() for m in maps) + gdn.o_proj.weight.numel()     # multiply-adds a token, forward; as many backward
    return 2 * 2 * tokens * per_token

def profile_step(gdn, n: int) -> dict:
    "CPU seconds per step of each part, from the profiler over STEPS steps, and the median wall seconds of a step."
    x, t = torch.randn(n, SEQ_LEN, gdn.hidden_size), torch.randn(n, SEQ_LEN, gdn.hidden_size)
    m = torch.ones(n, SEQ_LEN, dtype=torch.long)
    def step(): mse_backward(gdn, x, t, m, n); gdn.zero_grad(set_to_none=True)
    for _ in range(2): step()                                                      # warm-up
    walls = []
    for _ in range(STEPS):
        t0 = time.perf_counter(); step(); walls.append(time.perf_counter() - t0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS): step()
    totals = {e.key: e.cpu_time_total / 1e6 for e in prof.key_averages()}
    profiled = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6
    parts = {p: sum(totals.get(k, 0.) for k in keys) / STEPS for p, keys in PARTS.items()}
    parts['rest'] = profiled / STEPS - sum(parts.values())
    return dict(median_wall_s=statistics.median(walls), profiled_s=profiled / STEPS, parts_s=parts)

def matmul_alone(tokens: int, width: int, reps: int = STEPS) -> float:
    "Median seconds of the projections' large matrix products alone: 5 width x width maps forward, 4 weight gradients, 1 input gradient."
    x, W = torch.randn(tokens, width), torch.randn(width, width)
    def run():
        for _ in range(5): x @ W
        for _ in range(4): x.T @ x
        x @ W.T
    run(); ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); run(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)

def main():
    torch.manual_seed(0); torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    gdn = GatedDeltaNet(**SHAPE)
    for name, p in gdn.named_parameters(): p.requires_grad_(not name.startswith(('o_proj', 'o_norm')))   # as in Phase 2
    rows = []
    for recipe, n in WINDOWS.items():
        r = profile_step(gdn, n)
        flops = projection_flops(gdn, n * SEQ_LEN)
        mm = matmul_alone(n * SEQ_LEN, SHAPE['hidden_size'])
        shares = {p: s / r['profiled_s'] for p, s in r['parts_s'].items()}
        rows.append(dict(recipe=recipe, windows=n, tokens=n * SEQ_LEN, steps=STEPS, median_step_s=round(r['median_wall_s'], 4),
                         profiled_step_s=round(r['profiled_s'], 4), parts_s={p: round(s, 4) for p, s in r['parts_s'].items()},
                         shares={p: round(s, 3) for p, s in shares.items()},
                         projection_gflops=round(flops / r['parts_s']['projections'] / 1e9, 1),
                         matmul_alone_s=round(mm, 4), matmul_alone_gflops=round(flops / mm / 1e9, 1)))
        print(f"{recipe:8} step {r['median_wall_s']:.3f} s: " + ', '.join(f'{p} {s:.0%}' for p, s in shares.items())
              + f"; projections {rows[-1]['projection_gflops']} GFLOP/s, the same products alone {rows[-1]['matmul_alone_gflops']} GFLOP/s")
    out = dict(machine=dict(cpu=platform.processor() or platform.machine(), cores=os.cpu_count(), torch=torch.__version__, threads=1,
                            load_before=round(load_before, 2), load_after=round(os.getloadavg()[0], 2)),
               shape=SHAPE, seq_len=SEQ_LEN, rows=rows)
    RESULTS.write_text(json.dumps(out, indent=1) + '\n')
    print('wrote', RESULTS.relative_to(ROOT))

if __name__ == '__main__': main()
