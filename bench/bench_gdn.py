"""Benchmark our chunked gated delta rule against the PyTorch references on this CPU.

Side by side on identical inputs (fp32, B=4, H=8, K=V=head_dim): ours (`chunk_gated_delta_rule_torch`, eager),
transformers' `torch_chunk_gated_delta_rule` (Qwen3-Next) and fla's `naive_chunk_gated_delta_rule`, each reference
eager and under `torch.compile` (compile time reported separately). Forward (no grad) and forward+backward.
Within each configuration the implementations are interleaved repetition by repetition, so background load
hits them alike. Wall-clock medians are the headline numbers; process CPU time is recorded too (it is far less
sensitive to other processes on a shared machine), as is the CPU share other processes took during the run.

Run: python bench/bench_gdn.py            (eager phase, then compiled references at T=512 within --compile-budget-s)
     python bench/bench_gdn.py --quick    (a seconds-long smoke test, not for numbers)
The committed results/gdn.json came from one invocation, recorded in meta.argv:
`python bench/bench_gdn.py --compile-T 2048 8192 512 --compile-refs hf_torch_chunk --compile-budget-s 3000`
on an otherwise idle machine (meta.total_bench_s says how long it took).
"""
import argparse, json, math, os, platform, statistics, sys, time
from pathlib import Path

os.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', '/tmp/taylor_calibrate_bench_inductor')   # a cold, private cache
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def references():
    "name -> callable(q, k, v, g, beta) for the two references (keyword calls: their positional orders differ)."
    import transformers.models.qwen3_next.modeling_qwen3_next as qwen3_next
    from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule
    hf = getattr(qwen3_next.torch_chunk_gated_delta_rule, '__wrapped__', qwen3_next.torch_chunk_gated_delta_rule)   # undo fla hijack
    return {'hf_torch_chunk': lambda q, k, v, g, beta: hf(query=q, key=k, value=v, g=g, beta=beta, chunk_size=64)[0],
            'fla_naive_chunk': lambda q, k, v, g, beta: naive_chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, chunk_size=64)[0]}


def ours():
    from taylor_calibrate.gdn import chunk_gated_delta_rule_torch
    return lambda q, k, v, g, beta: chunk_gated_delta_rule_torch(q=q, k=k, v=v, g=g, beta=beta, chunk_size=64)[0]


def make_inputs(B, T, H, K, seed=0):
    "Realistic inputs: L2-normalised q, k; per-head decays from fast to slow; sigmoid betas."
    gen = torch.Generator().manual_seed(seed)
    l2 = lambda x: x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)
    q, k = l2(torch.randn(B, T, H, K, generator=gen)), l2(torch.randn(B, T, H, K, generator=gen))
    v = torch.randn(B, T, H, K, generator=gen)
    g = -torch.logspace(-3, 0.5, H) * F.softplus(torch.randn(B, T, H, generator=gen))
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    return q, k, v, g, beta


def nominal_flops(B, T, H, K, V, C=64, backward=False):
    "Nominal chunked-form FLOPs (2 per multiply-add), 5C^2K + 3C^2V + 6CKV per chunk and head; forward+backward = 3x forward."
    n_chunks = math.ceil(T / C) * B * H
    f = (5 * C * C * K + 3 * C * C * V + 6 * C * K * V) * n_chunks
    return 3 * f if backward else f


def other_cpu_seconds():
    "CPU seconds used by every process on the machine except this one (from /proc/stat and our own rusage)."
    try:
        with open('/proc/stat') as f: fields = f.readline().split()[1:]
        busy = sum(int(x) for x in fields[:8]) - int(fields[3]) - int(fields[4])
        total_busy = busy / os.sysconf('SC_CLK_TCK')
    except OSError: return float('nan')
    t = os.times()
    return total_busy - (t.user + t.system)


def run_once(fn, inputs, backward):
    "One call; returns (wall s, cpu s)."
    w0, c0 = time.perf_counter(), time.process_time()
    if backward:
        xs = [x.detach().requires_grad_() for x in inputs]
        fn(*xs).sum().backward()
    else:
        with torch.no_grad(): fn(*inputs)
    return time.perf_counter() - w0, time.process_time() - c0


def peak_tensor_bytes(fn, inputs, backward):
    """Peak bytes of live torch tensors allocated during one call (profiler memory events; inputs excluded). Our kernel's
    buffer pool is emptied first, so every buffer it keeps is allocated, and counted, during the call."""
    from torch.profiler import profile
    from taylor_calibrate.gdn import release_kernel_buffers
    release_kernel_buffers()
    with profile(profile_memory=True) as p: run_once(fn, inputs, backward)
    evs = sorted(p.events(), key=lambda e: e.time_range.start)
    cur = peak = 0
    for e in evs:
        cur += e.self_cpu_memory_usage
        peak = max(peak, cur)
    return peak


def bmm_rate(K, C=64, reps=9):
    """GFLOP/s of the chunk-sized batched products [Z, C x K] @ [Z, K x C] and [Z, C x C] @ [Z, C x K], for a batch of 2048
    (tens of MB: memory-bound under load) and of 64 (cache-resident), written into a preallocated output."""
    out = {}
    for Z in (2048, 64):
        for name, (a, b) in {f'Z={Z} [{C}x{K}]@[{K}x{C}]': (torch.randn(Z, C, K), torch.randn(Z, K, C)),
                             f'Z={Z} [{C}x{C}]@[{C}x{K}]': (torch.randn(Z, C, C), torch.randn(Z, C, K))}.items():
            o = torch.bmm(a, b)
            ts = []
            for _ in range(reps):
                t = time.perf_counter(); torch.bmm(a, b, out=o); ts.append(time.perf_counter() - t)
            out[name] = 2 * Z * a.shape[1] * a.shape[2] * b.shape[2] / statistics.median(ts) / 1e9
    return out


def measure(fns, inputs, backward, reps, warm):
    "Interleave the implementations repetition by repetition; returns name -> [(wall, cpu)] and the others' CPU share."
    for n, fn in fns.items():
        if warm[n]: run_once(fn, inputs, backward)
    rows = {n: [] for n in fns}
    other0, w0 = other_cpu_seconds(), time.perf_counter()
    for r in range(max(reps.values())):
        for n, fn in fns.items():
            if r < reps[n]: rows[n].append(run_once(fn, inputs, backward))
    return rows, (other_cpu_seconds() - other0) / ((time.perf_counter() - w0) * (os.cpu_count() or 1))


def record(results, rows, other_frac, K, T, mode, B, H, extra, measure_peak, fns, inputs):
    flops = nominal_flops(B, T, H, K, K, backward=mode == 'fwd+bwd')
    for n, ts in rows.items():
        wall, cpu = statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)
        rec = dict(impl=n, head_dim=K, T=T, mode=mode, reps=len(ts), wall_s=wall, cpu_s=cpu, wall_all=[t[0] for t in ts],
                   gflops=flops / wall / 1e9, gflops_cpu_time=flops / cpu / 1e9, other_cpu_frac=other_frac) | extra.get(n, {})
        if measure_peak(n): rec['peak_mb'] = peak_tensor_bytes(fns[n], inputs, mode == 'fwd+bwd') / 2**20
        results['runs'].append(rec)
        print(json.dumps({k: (float(f'{v:.4g}') if isinstance(v, float) else v) for k, v in rec.items() if k != 'wall_all'}), flush=True)


def summarise(results, head_dims, Ts):
    """Ours against every reference configuration measured for each setting (compiled included where measured); each
    reference is compared with our run from the same interleaved loop ('ours' for eager, 'ours_rerun' for compiled)."""
    summary = []
    for K in [K for K in head_dims if f'K={K}' in results['bmm_gflops']]:
        rate = max(results['bmm_gflops'][f'K={K}'].values())        # the stricter (cache-resident) rate
        for T in Ts:
            for mode in ('fwd', 'fwd+bwd'):
                rows = {r['impl']: r for r in results['runs'] if r['head_dim'] == K and r['T'] == T and r['mode'] == mode and 'wall_s' in r}
                if 'ours' not in rows: continue
                mine = rows['ours']
                pairs = [(r, rows.get('ours_rerun', mine) if n.endswith('_compiled') else mine)
                         for n, r in rows.items() if n not in ('ours', 'ours_rerun')]
                if not pairs: continue
                best = min(pairs, key=lambda p: p[0]['wall_s'] / p[1]['wall_s'])
                best_cpu = min(pairs, key=lambda p: p[0]['cpu_s'] / p[1]['cpu_s'])
                peaks = [r['peak_mb'] for r, _ in pairs if 'peak_mb' in r]
                summary.append(dict(head_dim=K, T=T, mode=mode, ours_s=mine['wall_s'], ours_cpu_s=mine['cpu_s'],
                                    best_ref=best[0]['impl'], best_ref_s=best[0]['wall_s'], speedup_vs_best=best[0]['wall_s'] / best[1]['wall_s'],
                                    best_ref_by_cpu=best_cpu[0]['impl'], speedup_vs_best_cpu_time=best_cpu[0]['cpu_s'] / best_cpu[1]['cpu_s'],
                                    ours_gflops_cpu_time=mine['gflops_cpu_time'], ours_frac_of_bmm_rate=mine['gflops_cpu_time'] / rate,
                                    ours_peak_mb=mine.get('peak_mb'), min_ref_peak_mb=min(peaks) if peaks else None,
                                    refs_measured=sorted(r['impl'] for r, _ in pairs)))
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--out', default=str(ROOT / 'bench' / 'results' / 'gdn.json'))
    ap.add_argument('--threads', type=int, default=1,
                    help='intra-op threads (1: on a shared 2-core machine two OpenMP threads stall each other)')
    ap.add_argument('--quick', action='store_true', help='tiny smoke test (T=128, 2 repeats; compiles only with --compile-T 128)')
    ap.add_argument('--compile-T', type=int, nargs='*', default=[512],
                    help='sequence lengths at which the references are also compiled (a cold compile unrolls the chunk loop: '
                         'minutes at T=512 on this machine, far more at 2048 and 8192)')
    ap.add_argument('--compile-budget-s', type=float, default=600,
                    help='wall seconds for the compiled phase (run after every eager measurement); no new compile starts after it')
    ap.add_argument('--compile-refs', nargs='*', default=['hf_torch_chunk', 'fla_naive_chunk'], help='references to compile, in order')
    ap.add_argument('--compiled-only', action='store_true',
                    help='skip the eager phase: add the compiled phase to the existing results file given by --out')
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)          # for every implementation alike (cpu_defaults() does this in the package)
    start = time.perf_counter()

    B, H = 4, 8
    head_dims, Ts = ((32,), (128,)) if args.quick else ((64, 32), (512, 2048, 8192))
    reps_default = 2 if args.quick else 5
    impls = {'ours': ours()} | references()
    slow = {('fla_naive_chunk', 8192, 'fwd+bwd'): 2, ('hf_torch_chunk', 8192, 'fwd+bwd'): 3}   # and no warm-up call
    results = {'meta': dict(
        argv=sys.argv[1:], machine=platform.processor() or platform.machine(), cpus=os.cpu_count(), threads=args.threads,
        torch=torch.__version__, dtype='float32', B=B, H=H, chunk_size=64, flush_denormal=True,
        timing='median after one warm-up call; implementations interleaved per repetition; wall_s = wall clock, '
               'cpu_s = process CPU time (robust to other processes on a shared machine); other_cpu_frac = share of all '
               'CPUs used by other processes meanwhile',
        gflops='nominal 5C^2K+3C^2V+6CKV FLOPs per chunk and head (2 per multiply-add), fwd+bwd = 3x fwd, same count for every implementation',
        peak_mb='peak live torch tensor memory during one call, from profiler memory events (inputs excluded); '
                'fwd+bwd only; at T=8192 only ours and the transformers reference',
        fewer_repeats={f'{n} T={T} {m}': f'{r} repetitions, no warm-up call' for (n, T, m), r in slow.items()},
        compile='torch.compile(dynamic=False), cold private inductor cache, measured after all eager runs against a fresh '
                'measurement of ours; forward (no grad) and forward+backward compile separately; compile_s = first call '
                'minus the steady-state median; ours needs no compile',
        compile_note='dynamo unrolls the chunk loop of the references, so a cold compile grows with T (compile_s of each '
                     'compiled run); fla_naive_chunk is not compiled: its Python loop over the rows of every chunk unrolls '
                     'too, and in a trial under load its compile did not finish within 12 minutes at T=512'),
        'bmm_gflops': {}, 'runs': []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.compiled_only:
        prev = json.loads(out.read_text())
        results['meta'] = prev['meta'] | {'compiled_phase_argv': sys.argv[1:], 'eager_phase_total_s': prev['meta']['total_bench_s']}
        results['bmm_gflops'] = prev['bmm_gflops']
        results['runs'] = [r for r in prev['runs'] if 'skipped' not in r and not r['impl'].endswith(('_compiled', 'ours_rerun'))]
    def save():
        results['summary'] = summarise(results, head_dims, Ts)
        results['meta']['total_bench_s'] = time.perf_counter() - start
        out.write_text(json.dumps(results, indent=1))

    for K in (() if args.compiled_only else head_dims):               # phase 1: eager, everything
        results['bmm_gflops'][f'K={K}'] = bmm_rate(K)
        for T in Ts:
            inputs = make_inputs(B, T, H, K)
            with torch.no_grad():
                mine = impls['ours'](*inputs)
                agree = {n: {'max_abs_diff_vs_ours': (f(*inputs) - mine).abs().max().item()} for n, f in impls.items() if n != 'ours'}
            for mode in ('fwd+bwd', 'fwd'):
                reps = {n: slow.get((n, T, mode), reps_default) for n in impls}
                rows, other = measure(impls, inputs, mode == 'fwd+bwd', reps, {n: reps[n] == reps_default for n in impls})
                peak = lambda n: mode == 'fwd+bwd' and (T <= 2048 or n in ('ours', 'hf_torch_chunk'))
                record(results, rows, other, K, T, mode, B, H, agree, peak, impls, inputs)
                save()

    c0 = time.perf_counter()                                          # phase 2: compiled references, within a budget
    for T in [t for t in args.compile_T if t in Ts]:
        for mode in ('fwd+bwd', 'fwd'):                               # forward+backward first: it is the target
            for K in head_dims:
                inputs = make_inputs(B, T, H, K)
                fns, extra = {'ours': impls['ours']}, {}
                for name in args.compile_refs:
                    cname = f'{name}_compiled'
                    if time.perf_counter() - c0 > args.compile_budget_s:
                        results['runs'].append(dict(impl=cname, head_dim=K, T=T, mode=mode,
                                                    skipped=f'compile budget of {args.compile_budget_s:.0f} s spent'))
                        continue
                    fn = torch.compile(impls[name], dynamic=False)
                    first, first_cpu = run_once(fn, inputs, mode == 'fwd+bwd')
                    print(f'compiled {cname} K={K} T={T} {mode}: first call {first:.1f} s wall, {first_cpu:.1f} s CPU', flush=True)
                    fns[cname], extra[cname] = fn, dict(first_call_s=first, first_call_cpu_s=first_cpu)
                if len(fns) == 1: continue
                reps = {n: reps_default for n in fns}
                rows, other = measure(fns, inputs, mode == 'fwd+bwd', reps, {n: n == 'ours' for n in fns})
                rows['ours_rerun'] = rows.pop('ours')
                for n, e in extra.items():
                    e['compile_s'] = e['first_call_s'] - statistics.median(t[0] for t in rows[n])
                record(results, rows, other, K, T, mode, B, H, extra, lambda n: mode == 'fwd+bwd' and n != 'ours_rerun', fns | {'ours_rerun': impls['ours']}, inputs)
                torch._dynamo.reset()
                save()
    done = {(r['impl'], r['head_dim'], r['T'], r['mode']) for r in results['runs']}
    for K in head_dims:
        for T in Ts:
            for mode in ('fwd+bwd', 'fwd'):
                for name in references():
                    if (f'{name}_compiled', K, T, mode) in done: continue
                    why = (f'not compiled at T={T}: a cold compile unrolls the chunk loop; see meta.compile_note'
                           if T not in args.compile_T else 'not compiled: not in --compile-refs' if name not in args.compile_refs else None)
                    if why: results['runs'].append(dict(impl=f'{name}_compiled', head_dim=K, T=T, mode=mode, skipped=why))
    save()
    for row in results['summary']: print(json.dumps({k: (float(f'{v:.4g}') if isinstance(v, float) else v) for k, v in row.items()}))


if __name__ == '__main__':
    main()
