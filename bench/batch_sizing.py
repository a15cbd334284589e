"""Working memory and time of `calibrate` with its batches sized by `core.BATCH_BYTES` against fixed batches, side by side.

`sized` is `calibrate` as it is: every step takes `windows_at_once` windows at a time, Phase 1's sums over all
calibration tokens run window by window when they do not fit in `BATCH_BYTES`, Phase 2 accumulates its batch's
gradient over parts, and the CPU kernel keeps at most `BATCH_BYTES` of buffers. `fixed` is the same code with
`windows_at_once` returning its `most` (every step eight windows at a time, Phase 1's sums over all tokens at once,
Phase 2's batch in one backward) and the kernel's pool left at 1 GiB.

Model: a random-weight model of a published shape from `bench/full_size.py` (default Qwen3-0.6B), cut to four decoder
layers (`uniform:0.25` converts layers 1, 2 and 3: per-layer working memory is that of the full model), float32, CPU,
one thread, `MALLOC_MMAP_THRESHOLD_=131072`. Run: `calibrate(..., init='taylor+')` at the recipe's token budget
(16,384 calibration + 2,048 held-out tokens, windows of 512) and 4 Phase-2 steps a layer.
Each run is a fresh subprocess; the order is fixed, sized, sized, fixed, fixed, sized. Reported per run: calibrate's
seconds and its peak resident memory above the resident set before it (VmHWM after resetting it; MB), and that
less the converted layers' GDN weights (`working_mb`: the cut model's weights are mostly its embeddings, so a
multiple of them would say little); medians per mode, and sized/fixed ratios. Each run also hashes the calibrated layers' state (the two modes agree to rounding,
not to the bit, where the sizes differ).
Run: `python bench/batch_sizing.py` (writes bench/results/batch_sizing.json; about 15 minutes on one core).
"""
import argparse, json, os, platform, statistics, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / 'bench' / 'results' / 'batch_sizing.json'
ORDER = ['fixed', 'sized', 'sized', 'fixed', 'fixed', 'sized']


def run_once(shape, mode, layers, steps):
    "One calibration in this process; prints seconds and peak memory as JSON."
    import contextlib, hashlib
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / 'bench'))
    import taylor_calibrate.core as core
    from full_size import config_for, gdn_params, SEQ, _status
    from transformers import AutoModelForCausalLM
    if mode == 'fixed':
        core.windows_at_once = lambda width, seq_len, tensors=8, most=8: most
        core.kernel_buffers_at_most = lambda nbytes: contextlib.nullcontext()
    c = config_for(shape); c.num_hidden_layers = layers
    torch.manual_seed(0)
    teacher = AutoModelForCausalLM.from_config(c, dtype=torch.float32).eval()
    weight_mb = sum(p.numel() * p.element_size() for p in teacher.parameters()) / 2**20
    ids = torch.randint(0, c.vocab_size, (48, SEQ), generator=torch.Generator().manual_seed(0))
    Path('/proc/self/clear_refs').write_text('5')
    rss0, t0 = _status('VmRSS'), time.perf_counter()
    hybrid = core.calibrate(teacher, ids, init='taylor+', steps=steps, progress=False)
    seconds, extra = time.perf_counter() - t0, _status('VmHWM') - rss0
    rep = hybrid.calibration_report
    gdn_mb = len(rep.converted) * gdn_params(c) * 4 / 2**20
    h = hashlib.sha256()
    for k, v in hybrid.state_dict().items():
        if '.gdn.' in k: h.update(k.encode()); h.update(v.contiguous().numpy().tobytes())
    print('RESULT ' + json.dumps(dict(mode=mode, seconds=round(seconds, 2), extra_mb=round(extra), gdn_mb=round(gdn_mb),
                                      weight_mb=round(weight_mb), working_mb=round(extra - gdn_mb),
                                      timings={k: round(v, 2) for k, v in rep.timings.items()}, gdn_state_sha256=h.hexdigest())))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--shape', default='Qwen3-0.6B')
    p.add_argument('--layers', type=int, default=4)
    p.add_argument('--steps', type=int, default=4)
    p.add_argument('--out', default=str(RESULTS))
    p.add_argument('--one', default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one: return run_once(a.shape, a.one, a.layers, a.steps)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_='131072')
    runs = []
    for mode in ORDER:
        r = subprocess.run([sys.executable, __file__, '--one', mode, '--shape', a.shape, '--layers', str(a.layers), '--steps', str(a.steps)],
                           capture_output=True, text=True, env=env)
        if r.returncode: raise SystemExit(f'{mode} failed:\n{r.stderr[-4000:]}')
        runs.append(json.loads([l for l in r.stdout.splitlines() if l.startswith('RESULT ')][-1][7:]))
        runs[-1]['loadavg'] = os.getloadavg()
        print(runs[-1], flush=True)
    med = {m: {k: statistics.median(r[k] for r in runs if r['mode'] == m) for k in ('seconds', 'extra_mb', 'working_mb')}
           for m in ('fixed', 'sized')}
    out = dict(shape=a.shape, layers=a.layers, steps=a.steps, init='taylor+', order=ORDER, malloc='131072', threads=1,
               machine=dict(cpu_count=os.cpu_count(), platform=platform.platform()), runs=runs, medians=med,
               ratio_sized_over_fixed={k: round(med['sized'][k] / med['fixed'][k], 3) for k in ('seconds', 'extra_mb', 'working_mb')})
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out['medians']), out['ratio_sized_over_fixed'])


if __name__ == '__main__':
    main()
