"""One Phase-2 step at one and at two CPU threads, at the layer shapes of the shipped teachers and of SmolLM2-135M.

Phase 2 is nearly all of calibrate's time, and its step is one forward and backward of a GDN layer on the calibration
windows. This times that step (`windows.mse_backward`, the function Phase 2 calls) on random inputs at each shape and
thread count, interleaved (1, 2, 1, 2, ... threads) so that both see the same machine, and reports medians and the ratio.
`taylor` steps on 2 windows of 512 tokens (the paper's 1,024 calibration tokens, full batch), `taylor+` on 4.

This is what `--threads auto` rests on: it runs a shipped teacher on one thread and a wider teacher on the cores that are
idle when the command starts.

Run: `python bench/phase2_threads.py` (about two minutes; writes bench/results/phase2_threads.json). Run it on an
otherwise idle machine: the `load_before` it records says whether it was.
"""
import json, os, platform, statistics, time
from pathlib import Path
import torch
from taylor_calibrate.gdn import GatedDeltaNet
from taylor_calibrate.windows import mse_backward

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT/'bench'/'results'/'phase2_threads.json'
SHAPES = {'tiny-qwen2 / tiny-qwen3': dict(hidden_size=256, num_heads=8, head_dim=32),
          'smollm2-135m': dict(hidden_size=576, num_heads=9, head_dim=64)}
WINDOWS = {'taylor': 2, 'taylor+': 4}
SEQ_LEN, REPS = 512, 9

def step_seconds(gdn, n: int, threads: int) -> float:
    "Wall seconds of one Phase-2 step (forward, MSE, backward) on n random windows at `threads` threads."
    torch.set_num_threads(threads)
    x, t = torch.randn(n, SEQ_LEN, gdn.hidden_size), torch.randn(n, SEQ_LEN, gdn.hidden_size)
    m = torch.ones(n, SEQ_LEN, dtype=torch.long)
    t0 = time.perf_counter(); mse_backward(gdn, x, t, m, n); gdn.zero_grad(set_to_none=True)
    return time.perf_counter() - t0

def main():
    torch.manual_seed(0)
    load_before = os.getloadavg()[0]
    rows = []
    for shape, kw in SHAPES.items():
        gdn = GatedDeltaNet(**kw)
        for p in gdn.parameters(): p.requires_grad_(True)
        for recipe, n in WINDOWS.items():
            for th in (1, 2): step_seconds(gdn, n, th)                      # warm-up at both counts
            times = {1: [], 2: []}
            for _ in range(REPS):
                for th in (1, 2): times[th].append(step_seconds(gdn, n, th))
            med = {th: statistics.median(v) for th, v in times.items()}
            rows.append(dict(shape=shape, **kw, recipe=recipe, windows=n, tokens=n * SEQ_LEN, reps=REPS,
                             median_s_1_thread=round(med[1], 4), median_s_2_threads=round(med[2], 4),
                             speedup_2_threads=round(med[1] / med[2], 2)))
            print(f'{shape:24} {recipe:8} 1 thread {med[1]:.3f} s   2 threads {med[2]:.3f} s   x{med[1] / med[2]:.2f}')
    out = dict(machine=dict(cpu=platform.processor() or platform.machine(), cores=os.cpu_count(), torch=torch.__version__,
                            load_before=round(load_before, 2), load_after=round(os.getloadavg()[0], 2)),
               seq_len=SEQ_LEN, rows=rows)
    RESULTS.write_text(json.dumps(out, indent=1) + '\n')
    print('wrote', RESULTS.relative_to(ROOT))

if __name__ == '__main__': main()
