"""One prepared run for a CUDA GPU: the checks that need one, in a single call.

1. layer agreement: the same `GatedDeltaNet` weights and inputs on the CPU (our PyTorch kernel) and on
   CUDA (fla's Triton kernels): outputs, the gradients of the input and of every parameter, and chunked
   prefill followed by single-token steps (fla's fused recurrent kernel), as relative errors; the same
   for `KimiDeltaAttention` (fla's `chunk_kda` on CUDA) and `Mamba2Layer` (fla's `chunk_simple_gla` on CUDA).
2. kernel timing: fla's `chunk_gated_delta_rule` vs our `chunk_gated_delta_rule_torch`, both on CUDA,
   B=4, H=8, T in {2048, 8192}, head_dim 64 and 128, fp32 and bf16, forward and forward+backward
   (median of 10 after 3 warm-ups, CUDA events; peak memory).
3. teacher tokens: the shipped teacher's architecture trained from scratch on CUDA with
   `scripts/train_teacher.py` (same recipe, batch 64 x 512, bf16 autocast) for about `--teacher-seconds`;
   at every evaluation the smallest and largest head mean attention distance and an induction probe.
   It answers: how many tokens does this size need before a head's mean distance drops below 3 tokens?

4. full-size shapes: `bench/full_size.py`'s run on the GPU, bf16 teachers of the Qwen2.5-0.5B, Qwen3-0.6B and
   Llama-3.2-1B shapes (random weights), `calibrate` with `taylor` and `taylor+` at the recipes' token budgets
   and --full-size-steps Phase-2 steps: time per stage, peak CUDA memory above the teacher, save/load/generate.
5. FSDP: recovery distillation of the shipped teacher's hybrid under `accelerate launch --config_file
   bench/accelerate_fsdp.yaml` on every GPU there is: 8 steps straight, and 4 steps then a resume to 8 from
   the sharded checkpoint; the two runs' train KL side by side (the resume is exact when they agree).

Writes `device_check.json` (and the GPU teacher's folder) under --out. Nothing is asserted: it measures.
`--parts` runs a subset (agreement, timing, teacher, full_size, fsdp).

On the device machine (its image has torch, transformers and triton, not fla or plotly). Here, once:
    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \\
        flash-linear-attention==0.6.0 fla-core==0.6.0 plotly==7.1.0 accelerate==1.15.0
(plotly because `taylor_calibrate.teacher` imports it, accelerate for part 5), then run with carry ['.whl'] and
timeout_s 600:
    pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:. \\
        && PYTHONUNBUFFERED=1 python3 bench/device_check.py --out $OUT
About 7 minutes for parts 1-3 with the default --teacher-seconds 240; parts 4 and 5 are not yet run on a GPU
(with one 10-minute call, run them in a second call: `--parts full_size fsdp`).
Here, without a GPU: `python bench/device_check.py --quick --out /tmp/dc` runs every part on the CPU at toy
sizes (both sides of each comparison then use our kernel), to check the script itself.
"""
import argparse, copy, json, os, statistics, sys, tempfile, time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / 'scripts'), str(ROOT / 'bench')]
from taylor_calibrate.gdn import GatedDeltaNet, chunk_gated_delta_rule_torch  # noqa: E402
from taylor_calibrate.kda import KimiDeltaAttention  # noqa: E402
from taylor_calibrate.mamba2 import Mamba2Layer  # noqa: E402
from taylor_calibrate.device import fla_kernels_available  # noqa: E402


PARTS = ['agreement', 'timing', 'teacher', 'full_size', 'fsdp']


def rel_err(a, b) -> float:
    "max |a - b| / max |b|, in float64 on the CPU."
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def layer_agreement(dev, T=300, head_dim=64, seed=0, layer_class=GatedDeltaNet, **options):
    "Relative errors between a `layer_class` layer on `dev` and the same layer on the CPU: forward, gradients, prefill + steps."
    torch.manual_seed(seed)
    H, D = 4, 256
    cpu = layer_class(D, H, head_dim, **options)
    with torch.no_grad():   # non-trivial biases, gate and norm weights
        for n, p in cpu.named_parameters():
            if n.endswith('bias') or n == 'o_norm.weight': p.add_(0.1 * torch.randn_like(p))
    gpu = copy.deepcopy(cpu).to(dev)
    x = torch.randn(2, T, D)
    mask = torch.ones(2, T, dtype=torch.long); mask[1, :37] = 0          # left padding in the second row
    w = torch.randn(2, T, D)
    res = {}
    for name, layer, d in (('cpu', cpu, 'cpu'), ('dev', gpu, dev)):
        xi = x.to(d).requires_grad_()
        y, _ = layer(xi, mask.to(d))
        (y * w.to(d)).sum().backward()
        res[name] = dict(y=y, dx=xi.grad, **{f'd{n}': p.grad for n, p in layer.named_parameters()})
    out = {k: rel_err(res['dev'][k], res['cpu'][k]) for k in res['cpu']}
    with torch.no_grad():   # chunked prefill, then single-token steps with the carried state, vs one pass on the CPU
        full, _ = cpu(x[:1])
        y0, st = gpu(x[:1, :T - 5].to(dev), use_cache=True)
        steps = [y0]
        for t in range(T - 5, T):
            yt, st = gpu(x[:1, t:t + 1].to(dev), state=st, use_cache=True); steps.append(yt)
        out['prefill_then_steps'] = rel_err(torch.cat(steps, 1), full)
    return dict(layer=layer_class.__name__, T=T, head_dim=head_dim, options=options, rel_err=out, worst=max(out.values()))


def cuda_time(fn, reps=10, warmup=3):
    "Median seconds of fn() over `reps` runs after `warmup`, timed with CUDA events (wall clock on the CPU)."
    for _ in range(warmup): fn()
    times = []
    for _ in range(reps):
        if torch.cuda.is_available():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); fn(); e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e) / 1e3)
        else:
            t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return statistics.median(times)


def kernel_inputs(B, T, H, K, dtype, dev, seed=0):
    "bench_gdn.py's inputs on `dev`: q, k, v in `dtype`, beta too, the log decay g in float32."
    from bench_gdn import make_inputs
    q, k, v, g, beta = make_inputs(B, T, H, K, seed)
    return [t.to(dev, dtype) for t in (q, k, v)] + [g.to(dev), beta.to(dev, dtype)]


def kernels(dev):
    "name -> callable(q, k, v, g, beta) -> o, for the kernels to time on `dev`."
    ks = {'ours_torch': lambda q, k, v, g, b: chunk_gated_delta_rule_torch(q, k, v, g, b)[0]}
    if fla_kernels_available(dev):
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        ks['fla_chunk'] = lambda q, k, v, g, b: chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=b)[0]
    return ks


def kernel_timing(dev, sizes, B=4, H=8):
    "Forward and forward+backward medians of every kernel on identical inputs, with the error of ours vs fla's."
    rows = []
    for T, K, dtype in sizes:
        inputs = kernel_inputs(B, T, H, K, dtype, dev)
        outs = {}
        for name, f in kernels(dev).items():
            with torch.no_grad(): outs[name] = f(*inputs).float()
            if torch.cuda.is_available(): torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
            fwd = cuda_time(lambda: f(*inputs))
            leaves = [t.detach().requires_grad_() for t in inputs]
            go = torch.randn_like(outs[name]).to(inputs[2].dtype)
            def fwd_bwd():
                for t in leaves: t.grad = None
                f(*leaves).backward(go)
            with torch.enable_grad(): fb = cuda_time(fwd_bwd)
            peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
            rows.append(dict(kernel=name, T=T, head_dim=K, dtype=str(dtype).replace('torch.', ''), fwd_s=fwd, fwd_bwd_s=fb, peak_MiB=peak))
            print(rows[-1], flush=True)
        if len(outs) == 2: rows[-1]['ours_vs_fla_rel_err'] = rel_err(outs['ours_torch'], outs['fla_chunk'])
    return rows


def teacher_tokens(dev, seconds, out, quick=False):
    "Train the shipped teacher's architecture from scratch on `dev` for about `seconds`; the head probes along the way."
    import train_teacher
    r = dict(train_teacher.RECIPE, batch_size=64 if not quick else 2, seq_len=512 if not quick else 64)
    probe = train_teacher.main(dict(r, steps=40 if not quick else 2, eval_every=40), threads=min(16, os.cpu_count()), device=dev,
                                 out=tempfile.mkdtemp())
    step_s = probe['train_seconds'] / len(probe['steps'])
    steps = max(2, int(seconds / step_s)) if not quick else 3
    log = train_teacher.main(dict(r, steps=steps, eval_every=max(1, steps // 20)), threads=min(16, os.cpu_count()), device=dev, out=out / 'teacher_gpu',
                             max_seconds=1.2 * seconds)
    under3 = [h for h in log['heads'] if h['min_mean_distance'] < 3]
    return dict(batch_size=r['batch_size'], steps=len(log['steps']), tokens=log['train_tokens'], seconds=log['train_seconds'],
                valid_loss=log['valid_loss'], eval_steps=log['eval_steps'], heads=log['heads'],
                first_step_under_3_tokens=under3[0]['step'] if under3 else None,
                tokens_until_under_3=under3[0]['step'] * log['tokens_per_step'] if under3 else None)


def full_size(dev, steps, quick=False):
    "bench/full_size.py's measurement of each shape and init on `dev` (bf16 teachers), one process each."
    import subprocess
    shapes = ['Qwen2.5-0.5B'] if quick else ['Qwen2.5-0.5B', 'Qwen3-0.6B', 'Llama-3.2-1B']
    rows = []
    for name in shapes:
        for init in ('taylor+', 'taylor'):
            cmd = [sys.executable, str(ROOT / 'bench' / 'full_size.py'), '--one', name, '--init', init, '--device', dev,
                   '--dtype', 'float32' if quick else 'bfloat16', '--steps', str(steps), '--threads', str(min(16, os.cpu_count()))]
            if quick: cmd.append('--quick'); cmd += ['--calib-tokens', '1024']
            r = subprocess.run(cmd, capture_output=True, text=True)
            got = [l for l in r.stdout.splitlines() if l.startswith('RESULT ')]
            rows.append(json.loads(got[-1][7:]) if got else dict(shape=name, init=init, error=r.stderr[-2000:]))
            print({k: rows[-1].get(k) for k in ('shape', 'init', 'timings', 'error')}, flush=True)
    return rows


FSDP_RUN = """
import json, sys, torch
from accelerate import PartialState
from taylor_calibrate.teacher import load_teacher, corpus_token_ids
from taylor_calibrate.convert import to_hybrid
from taylor_calibrate.distill import distill
steps, out, ckpt, seq = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
teacher, tok = load_teacher()
student = to_hybrid(teacher, 'uniform:0.25')
ids = corpus_token_ids(tok, 'train', max_tokens=64 * seq)
log = distill(student, teacher, ids, tokens=steps * 4 * seq * PartialState().num_processes, seq_len=seq, batch_size=4,
              checkpoint_dir=ckpt, checkpoint_every_tokens=4 * seq, progress=False)
if PartialState().is_main_process: open(out, 'w').write(json.dumps(dict(train_kl=log.train_kl, distributed=str(PartialState().distributed_type))))
"""


def fsdp_resume(dev, quick=False):
    "Distil 8 steps straight, and 4 then a resume to 8, under the FSDP config (GPUs) or one plain process (CPU)."
    import subprocess
    work = Path(tempfile.mkdtemp()); (work / 'run.py').write_text(FSDP_RUN)
    n = torch.cuda.device_count() if dev == 'cuda' else 1
    launch = [sys.executable, '-m', 'accelerate.commands.launch', '--num_processes', str(n)]
    if dev == 'cuda': launch[3:3] = ['--config_file', str(ROOT / 'bench' / 'accelerate_fsdp.yaml')]
    seq = 64 if quick else 512
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
    def run(steps, name, ckpt):
        t0 = time.time()
        r = subprocess.run(launch + [str(work / 'run.py'), str(steps), str(work / name), str(work / ckpt), str(seq)],
                           capture_output=True, text=True, env=env)
        if r.returncode: return dict(error=r.stderr[-3000:])
        return dict(json.loads((work / name).read_text()), seconds=round(time.time() - t0, 1))
    straight = run(8, 'straight.json', 'ck_straight')
    first = run(4, 'first.json', 'ck_resumed')
    resumed = run(8, 'resumed.json', 'ck_resumed')
    res = dict(processes=n, straight=straight, first_half=first, resumed=resumed)
    if all('train_kl' in r for r in (straight, resumed)):
        a, b = straight['train_kl'], resumed['train_kl']
        res['max_abs_kl_diff'] = max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else None
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', required=True)
    p.add_argument('--teacher-seconds', type=float, default=240)
    p.add_argument('--quick', action='store_true', help='toy sizes on whatever device there is (checks the script, not for numbers)')
    p.add_argument('--parts', nargs='+', default=PARTS, choices=PARTS)
    p.add_argument('--full-size-steps', type=int, default=60, help='Phase-2 steps a layer in part 4 (the recipes use 300)')
    a = p.parse_args()
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    t0 = time.time()
    res = dict(meta=dict(device=torch.cuda.get_device_name() if dev == 'cuda' else 'cpu', torch=torch.__version__,
                         fla_kernels=fla_kernels_available(dev), argv=sys.argv[1:]))
    def save(): (out / 'device_check.json').write_text(json.dumps(res, indent=1))
    T = 130 if a.quick else 300
    if 'agreement' in a.parts:
        res['layer_agreement'] = [layer_agreement(dev, T, 64),
                                  layer_agreement(dev, T, 32, use_short_conv=True, qkv_bias=True, allow_neg_eigval=True),
                                  layer_agreement(dev, T, 64, qkv_activation='identity', use_gate=False),
                                  layer_agreement(dev, T, 64, layer_class=KimiDeltaAttention),      # fla's chunk_kda on CUDA
                                  layer_agreement(dev, T, 64, layer_class=Mamba2Layer, state_size=64)]   # fla's chunk_simple_gla on CUDA
        print(res['layer_agreement'], flush=True); save()
    if 'timing' in a.parts:
        sizes = [(256, 32, torch.float32)] if a.quick else \
            [(T, K, dt) for dt in (torch.float32, torch.bfloat16) for K in (64, 128) for T in (2048, 8192)]
        res['kernel_timing'] = kernel_timing(dev, sizes, B=1 if a.quick else 4, H=2 if a.quick else 8); save()
    if 'teacher' in a.parts:
        res['teacher_tokens'] = teacher_tokens(dev, a.teacher_seconds, out, a.quick); save()
        print(json.dumps(res['teacher_tokens'], indent=1))
    if 'full_size' in a.parts:
        res['full_size'] = full_size(dev, 2 if a.quick else a.full_size_steps, a.quick); save()
    if 'fsdp' in a.parts:
        res['fsdp'] = fsdp_resume(dev, a.quick); save()
        print(json.dumps({k: v for k, v in res['fsdp'].items() if k != 'first_half'}, indent=1))
    res['meta']['total_s'] = round(time.time() - t0, 1); save()


if __name__ == '__main__':
    main()
