"""Streamed teacher attention statistics vs the eager `output_attentions=True` approach.

Model: the shipped tiny teacher when `taylor_calibrate.teacher.load_teacher()` loads, else a random-init Qwen2 of
the same shape (vocab 8192, hidden 256, 8 layers, 8 query heads on 2 KV heads, head size 32); float32, CPU.
Input: one sequence of T random token ids (batch 1). Every method computes, for all 8 layers and 8 query heads,
the mean attention distance, mean entropy and mean entropy / log(t+1).

Methods
- `streamed`: `taylor_calibrate.stats.attention_stats` (chunk 64, the default; also computes the distance histogram).
- `eager_output_attentions`: the reference code's approach: eager attention, `output_attentions=True` on the base
  model (all layers' [1, 8, T, T] weights returned), then the statistics from the matrices.
- `eager_per_layer`: eager attention whose [1, 8, T, T] weights are reduced to statistics in a forward hook on each
  attention module and dropped at once (one layer's matrices alive at a time): a lower bound on what the eager
  approach can use, and the only eager variant that fits at T=8192 here (`output_attentions=True` would return
  8 x 8 x 8192^2 x 4 B = 17.2 GB of weights; this machine has 23 GB shared with other jobs).

Peak memory: every (method, T) runs in a fresh subprocess. After the model is built, the input made and one
warm-up call at T=256, the process resets its peak-RSS counter (writing 5 to /proc/self/clear_refs) and reads
VmRSS (baseline); after the timed runs it reads VmHWM (peak resident set size) from /proc/self/status.
`peak_rss_mb` is VmHWM, `extra_rss_mb` = VmHWM - baseline, i.e. the memory the statistics themselves needed.

Timing: time.perf_counter around each call, `runs` calls after the warm-up, median reported; 1 intra-op thread,
denormals flushed (both methods alike). The machine is shared (2 cores, a training job): the load average is
recorded. Run: `python bench/bench_stats.py` (writes bench/results/stats.json).
"""
import json, math, os, statistics, subprocess, sys, time
from pathlib import Path

RESULTS = Path(__file__).parent / 'results' / 'stats.json'
# (method, T, runs): 5 timed runs where the budget allows (~15-20 min in all on the shared machine); fewer for the
# slowest cases (each eager run at T=8192 takes minutes, and one streamed run at T=32768 several).
PLAN = [('streamed', 1024, 5), ('eager_output_attentions', 1024, 5), ('eager_per_layer', 1024, 3),
        ('streamed', 4096, 5), ('eager_output_attentions', 4096, 2), ('eager_per_layer', 4096, 2),
        ('streamed', 8192, 3), ('eager_per_layer', 8192, 1),
        ('streamed', 32768, 1)]
SKIPPED = [dict(method='eager_output_attentions', T=8192,
                reason='needs the 8 layers x 8 heads x 8192^2 float32 weights returned at once: 17.2 GB, more than '
                       'this shared 23 GB machine can give; eager_per_layer is the eager figure at T=8192'),
           dict(method='eager_*', T=32768, reason='one layer alone would need 8 x 32768^2 x 4 B = 34 GB')]

def _status():
    return {k: int(v.split()[0]) for k, v in (l.split(':', 1) for l in open('/proc/self/status')) if k in ('VmRSS', 'VmHWM')}

def _model():
    import torch
    try:
        from taylor_calibrate.teacher import load_teacher
        model, _ = load_teacher(dtype=torch.float32)
        return model.eval(), 'shipped teacher (taylor_calibrate.teacher.load_teacher)'
    except Exception as e:
        from transformers import Qwen2Config, Qwen2ForCausalLM
        torch.manual_seed(0)
        cfg = Qwen2Config(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
                          num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=32768)
        return Qwen2ForCausalLM(cfg).eval(), f'random-init Qwen2 of the teacher shape (teacher not loadable: {type(e).__name__})'

def _stats_from_weights(p, dist):
    "Mean distance, entropy and entropy/log(t+1) per head from full weights p [1, H, T, T] (the reference approach)."
    import torch
    T = p.shape[-1]
    ent = -torch.special.xlogy(p, p).sum(-1)                                   # [1, H, T]
    return dict(mean_distance=(p * dist).sum(-1).mean((0, 2)), entropy=ent.mean((0, 2)),
                rel_entropy=(ent[..., 1:] / torch.log(torch.arange(2, T + 1, dtype=p.dtype))).mean((0, 2)))

def _runner(method, model):
    import torch
    from taylor_calibrate.stats import attention_stats, attn_implementation, decoder_attention_modules
    if method == 'streamed':
        return lambda ids: attention_stats(model, ids, batch_size=1, chunk_size=64, progress=False)
    def eager(ids):
        T = ids.shape[1]
        dist = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp(min=0).float()
        with torch.no_grad(), attn_implementation(model, 'eager'):
            if method == 'eager_output_attentions':
                att = model.base_model(input_ids=ids, output_attentions=True, use_cache=False).attentions
                return [_stats_from_weights(p, dist) for p in att]
            res, hooks = [], []
            def hook(mod, args, out): res.append(_stats_from_weights(out[1], dist))
            try:
                hooks = [a.register_forward_hook(hook) for a in decoder_attention_modules(model)]
                model.base_model(input_ids=ids, use_cache=False)
            finally:
                for h in hooks: h.remove()
            return res
    return eager

def worker(method, T, runs):
    import gc, torch
    from taylor_calibrate.device import cpu_defaults
    cpu_defaults(threads=1)
    model, model_desc = _model()
    ids = torch.randint(0, model.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(T))
    fn = _runner(method, model)
    fn(ids[:, :256])                                                           # warm-up (same code path)
    gc.collect()
    open('/proc/self/clear_refs', 'w').write('5')                              # reset VmHWM to the current RSS
    base = _status()['VmRSS']
    times = []
    for _ in range(runs):
        t0 = time.perf_counter(); fn(ids); times.append(time.perf_counter() - t0)
    peak = _status()['VmHWM']
    print(json.dumps(dict(method=method, T=T, runs=runs, times_s=[round(t, 3) for t in times],
                          median_s=round(statistics.median(times), 3), baseline_rss_mb=round(base / 1024, 1),
                          peak_rss_mb=round(peak / 1024, 1), extra_rss_mb=round((peak - base) / 1024, 1),
                          model=model_desc, loadavg_1min=os.getloadavg()[0])))

def main():
    rows = []
    for method, T, runs in PLAN:
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, '--worker', method, str(T), str(runs)], capture_output=True, text=True)
        if r.returncode:
            rows.append(dict(method=method, T=T, error=r.stderr[-800:])); print(method, T, 'FAILED', r.stderr[-800:])
            continue
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(f"{method:25s} T={T:6d} median {rows[-1]['median_s']:8.2f} s  extra RSS {rows[-1]['extra_rss_mb']:8.1f} MB"
              f"  ({time.perf_counter() - t0:.0f} s wall)", flush=True)
    ok = {(r['method'], r['T']): r for r in rows if 'error' not in r}
    ratios = []
    for T in (1024, 4096, 8192):
        s = ok.get(('streamed', T))
        for m in ('eager_output_attentions', 'eager_per_layer'):
            e = ok.get((m, T))
            if s and e:
                ratios.append(dict(T=T, baseline=m, time_ratio=round(e['median_s'] / s['median_s'], 2),
                                   extra_rss_ratio=round(e['extra_rss_mb'] / max(s['extra_rss_mb'], 1e-9), 1),
                                   peak_rss_ratio=round(e['peak_rss_mb'] / s['peak_rss_mb'], 2)))
    out = dict(description=__doc__.strip().splitlines()[0], method_notes=__doc__.strip(), torch_threads=1,
               machine=dict(cpus=os.cpu_count(), mem_gb=round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30, 1)),
               results=rows, skipped=SKIPPED, ratios_eager_over_streamed=ratios)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1))
    for r in ratios: print(r)

if __name__ == '__main__':
    if len(sys.argv) > 1 and sys.argv[1] == '--worker': worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else: main()
