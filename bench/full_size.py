"""What the pipeline costs at real model shapes: random-weight models built from the published configs.

Shapes run (random weights, float32 unless --dtype): Qwen2.5-0.5B, Qwen3-0.6B, Llama-3.2-1B (configs below, as
published: widths, layers, heads, KV heads, head size, vocabulary, RoPE settings, norm eps, tied embeddings).
Qwen2.5-3B and Qwen3-8B only enter the cost model. Random weights say nothing about quality: this measures time
per stage, peak memory, and that the plumbing holds at real shapes.

Each (shape, init) runs in a fresh subprocess (build, then `calibrate` first, so that its peak is its own), on
random token ids (windows of 512); the `taylor` process then times the building blocks, the `taylor+` one the rest:
- `statistics`: `attention_stats` of every layer on 4 windows (2,048 tokens);
- `convert`: `to_hybrid(teacher, 'uniform:0.25')` (an independent copy) and `share_weights=True` (what
  `calibrate` does);
- `calibrate_taylor`, `calibrate_taylor+`: `calibrate(..., keep='uniform:0.25')` with the recipes' token budgets
  unless --calib-tokens is given (taylor: 1,024 calibration + 1,024 held-out tokens; taylor+: 16,384 + 2,048) and
  a reduced Phase-2 budget (--steps, default 4 steps a layer instead of 300; the per-step cost is what the cost
  model scales);
- `save`, `load`, `generate`: `save_hybrid`, `load_hybrid`, and 16 greedy tokens from the loaded hybrid (checked
  equal to the in-memory hybrid's).
Peak memory: before a stage the process resets its peak-RSS counter (5 to /proc/self/clear_refs) and reads VmRSS;
after it, VmHWM. `extra_mb` = VmHWM - VmRSS before: what the stage needed on top of what was already resident.
The teacher's weight bytes are the yardstick (`extra_x_teacher`); `working_x_teacher` is the extra memory less the
converted layers' GDN weights (the product itself), in the same unit. glibc keeps freed heap memory
for reuse, so RSS overstates what a stage holds; runs made with `MALLOC_MMAP_THRESHOLD_=131072` in the
environment (large blocks returned to the OS at once, recorded as `malloc`) measure what it holds. Times are wall seconds of one run each (these
stages take minutes on a CPU; repeated runs would not fit), with the intra-op thread count recorded.

The cost model (`cost_model`) counts the FLOPs of each stage from a config and a recipe (the teacher passes over the
calibration and held-out windows, each as deep as the last converted layer: 2 x non-embedding weights per token plus
causal attention; Phase 2: 6 x a GDN layer's weights per trained token plus its held-out evaluations), fits one sustained rate per stage kind to the CPU measurements, and extrapolates to
Qwen2.5-3B and Qwen3-8B on one GPU at an assumed sustained rate, stated in the JSON. It is an estimate, not a
measurement: not yet run on a GPU.

Run: `python bench/full_size.py` (writes bench/results/full_size.json). The committed file comes from three calls
of one thread each, at most two at a time, all with `MALLOC_MMAP_THRESHOLD_=131072` in the environment and the
recipes' token budgets, then merged (`--merge`): `--shapes Qwen2.5-0.5B`, `--shapes Qwen3-0.6B` and
`--shapes Llama-3.2-1B`; each run records its arguments. The runs of other shapes already in the output file are kept;
`python bench/full_size.py --quick` checks the script on shrunken shapes in a minute.

Per init on the registry teacher's shape (every init, its own process each; writes
bench/results/full_size_smollm2-135m.json; the committed file: `MALLOC_MMAP_THRESHOLD_=131072`, one thread):
`python bench/full_size.py --shapes SmolLM2-135M --inits naive zero_gate phase1 phase2 taylor taylor+ --threads 1
--out bench/results/full_size_smollm2-135m.json`.
"""
import argparse, json, math, os, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / 'bench' / 'results' / 'full_size.json'

# Published configurations (config.json of each release); `kind` picks the transformers class.
SHAPES = {
    'Qwen2.5-0.5B': dict(kind='qwen2', hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, rope_parameters=dict(rope_type='default', rope_theta=1e6)),
    'Qwen3-0.6B': dict(kind='qwen3', hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, rope_parameters=dict(rope_type='default', rope_theta=1e6)),
    'Llama-3.2-1B': dict(kind='llama', hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, rope_parameters=dict(rope_type='llama3', rope_theta=5e5, factor=32.0,
                                                                          low_freq_factor=1.0, high_freq_factor=4.0,
                                                                          original_max_position_embeddings=8192)),
    # the registry teacher's shape (`load_teacher('smollm2-135m')`): memory does not depend on the weights' values
    'SmolLM2-135M': dict(kind='llama', hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, rope_parameters=dict(rope_type='default', rope_theta=1e5)),
    'Qwen2.5-3B': dict(kind='qwen2', hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, rope_parameters=dict(rope_type='default', rope_theta=1e6)),
    'Qwen3-8B': dict(kind='qwen3', hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
                     tie_word_embeddings=False, rope_parameters=dict(rope_type='default', rope_theta=1e6)),
}
RUN = ['Qwen2.5-0.5B', 'Qwen3-0.6B', 'Llama-3.2-1B']
INITS = ['naive', 'zero_gate', 'phase1', 'phase2', 'taylor', 'taylor+']
EXTRAPOLATE = ['Qwen2.5-3B', 'Qwen3-8B']
SEQ = 512
# Assumed sustained rates on one H100 (not measured): teacher passes in bf16 at 40% of the 989 TFLOP/s dense peak;
# Phase 2 in float32 (TF32 matmuls) at 10% of the 495 TFLOP/s peak, small per-layer batches.
GPU_RATE = dict(name='one H100 (assumed, not measured)', teacher_flops_per_s=0.40 * 989e12, phase2_flops_per_s=0.10 * 495e12)
# The authors' `init_time` of one student (Phase 1 and 2 of their recipe) on one H100, min and max over their GA-S2 probes:
# results/zeroshot_llama3b_{50,75}pct/ga_s2/taylor_distill.json and results/zeroshot_qwen3_8b_{25,50,75}pct/ga_s2/taylor_distill.json.
# The same logs' naive copies (baseline.json) take 132-141 s and 298-504 s: most of that time is loading and evaluating, not calibrating.
PAPER_S = {'Llama-3.2-3B': (184, 288), 'Qwen3-8B': (334, 549)}


def config_for(name, quick=False):
    "The transformers config of a shape (shrunk to 4 layers, a quarter of the width and a 4,096-token vocabulary with --quick)."
    from transformers import Qwen2Config, Qwen3Config, LlamaConfig
    kw = dict(SHAPES[name]); kind = kw.pop('kind')
    if quick: kw.update(num_hidden_layers=4, vocab_size=4096, hidden_size=kw['hidden_size'] // 4, intermediate_size=kw['intermediate_size'] // 4)
    cls = dict(qwen2=Qwen2Config, qwen3=Qwen3Config, llama=LlamaConfig)[kind]
    return cls(**kw, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _head_dim(c): return getattr(c, 'head_dim', None) or c.hidden_size // c.num_attention_heads


def non_embedding_params(c) -> int:
    "Weights a token passes through in the decoder layers (attention and MLP), biases and norms ignored."
    D, H, Hkv, d, I = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, _head_dim(c), c.intermediate_size
    return c.num_hidden_layers * (D * H * d * 2 + D * Hkv * d * 2 + 3 * D * I)


def all_params(c) -> int:
    return non_embedding_params(c) + c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)


def gdn_params(c) -> int:
    "One converted layer: q, k, v (KV heads repeated to every query head), o and the output gate, all H x d wide."
    D, H, d = c.hidden_size, c.num_attention_heads, _head_dim(c)
    return 5 * D * H * d + 2 * D * H


def teacher_pass_flops(c, tokens, depth=None) -> float:
    "FLOPs of a base-model forward over `tokens` tokens in windows of SEQ, through `depth` layers (all by default)."
    L = c.num_hidden_layers; depth = L if depth is None else depth
    attn = 2 * SEQ * c.num_attention_heads * _head_dim(c)   # causal QK^T and PV per token and layer, halved for causality
    return tokens * depth * (2 * non_embedding_params(c) / L + attn)


def recipe_budget(init, calib_tokens=None, heldout_tokens=None, steps=None):
    from taylor_calibrate.core import get_recipe
    r = get_recipe(init)
    cal, held = calib_tokens or r.calib_tokens, heldout_tokens or r.heldout_tokens
    batch = r.batch_windows * SEQ if r.minibatch and r.batch_windows else cal
    return dict(calib_tokens=cal, heldout_tokens=held, steps=steps or r.steps, batch_tokens=min(batch, cal), eval_every=r.eval_every)


def capture_layer_groups(c, converted, tokens, dtype_bytes=4):
    "`taylor_calibrate.core.capture_groups` on a weightless (meta-device) model of config `c`, and one layer's capture bytes."
    import torch
    from transformers import AutoModelForCausalLM
    from taylor_calibrate.core import capture_groups, capture_bytes
    with torch.device('meta'):
        model = AutoModelForCausalLM.from_config(c, dtype={2: torch.bfloat16, 4: torch.float32}[dtype_bytes])
    return capture_groups(model, converted, tokens), capture_bytes(model, converted[0], tokens)


def converted_layers(c, fraction=0.25):
    from taylor_calibrate.convert import uniform_layers
    kept = uniform_layers(c.num_hidden_layers, fraction)
    return [i for i in range(c.num_hidden_layers) if i not in kept]


def cost_model(c, init, budget, dtype_bytes=4):
    "FLOPs and memory of `calibrate` on config `c`: the teacher passes (statistics and captures) and Phase 2."
    conv = converted_layers(c)
    tokens = budget['calib_tokens'] + budget['heldout_tokens']
    groups, per_layer = capture_layer_groups(c, conv, tokens, dtype_bytes)
    # one pass over the calibration and one over the held-out windows, each as deep as the last converted layer
    teacher = teacher_pass_flops(c, tokens, conv[-1] + 1)
    n_eval = budget['steps'] // budget['eval_every'] + 1
    per_layer_p2 = 6 * gdn_params(c) * budget['steps'] * budget['batch_tokens'] + 2 * gdn_params(c) * n_eval * budget['heldout_tokens']
    phase2 = len(conv) * per_layer_p2 if init in ('taylor', 'taylor+', 'phase2') else 0.
    return dict(converted=len(conv), capture_groups=len(groups), capture_mb_per_layer=per_layer / 2**20,
                teacher_flops=teacher, phase2_flops=phase2, gdn_mb=len(conv) * gdn_params(c) * dtype_bytes / 2**20)


# ----- measuring one shape (in its own process) -----
def _status(key):
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith(key + ':'): return int(line.split()[1]) / 1024   # MiB
    raise KeyError(key)


class Stage:
    "Wall time and peak RSS above the resident set at the start (and, on a GPU, peak CUDA memory above the allocated)."
    def __init__(self, rows, name): self.rows, self.name = rows, name
    def __enter__(self):
        import torch
        self.cuda = torch.cuda.is_available()
        if self.cuda: torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); self.cuda0 = torch.cuda.memory_allocated()
        Path('/proc/self/clear_refs').write_text('5')
        self.rss0, self.t0 = _status('VmRSS'), time.perf_counter(); return self
    def __exit__(self, *exc):
        import torch
        if exc[0] is not None: return
        if self.cuda: torch.cuda.synchronize()
        row = dict(seconds=round(time.perf_counter() - self.t0, 2), rss_before_mb=round(self.rss0),
                   peak_mb=round(_status('VmHWM')), extra_mb=round(_status('VmHWM') - self.rss0))
        if self.cuda: row.update(cuda_before_mb=round(self.cuda0 / 2**20),
                                 cuda_extra_mb=round((torch.cuda.max_memory_allocated() - self.cuda0) / 2**20))
        self.rows[self.name] = row
        print(self.name, row, flush=True)


def _malloc() -> str:
    "glibc's setting for returning large blocks to the OS at once (MALLOC_MMAP_THRESHOLD_), or 'default'."
    return os.environ.get('MALLOC_MMAP_THRESHOLD_', 'default')


def measure(name, init, dtype, steps, calib_tokens, quick, device='cpu'):
    "One (shape, init) in a fresh process: build, calibrate first (so that its peak is its own), then the other stages."
    import torch
    from transformers import AutoModelForCausalLM
    sys.path.insert(0, str(ROOT))
    from taylor_calibrate.stats import attention_stats
    from taylor_calibrate.convert import to_hybrid, shared_weights
    from taylor_calibrate.hybrid import save_hybrid, load_hybrid
    from taylor_calibrate.core import calibrate
    torch.manual_seed(0)
    c = config_for(name, quick)
    dt = dict(float32=torch.float32, bfloat16=torch.bfloat16)[dtype]
    st = {}
    with Stage(st, 'build'):
        teacher = AutoModelForCausalLM.from_config(c, dtype=dt).eval().to(device)
    weight_bytes = sum(p.numel() * p.element_size() for p in teacher.parameters())
    ids = torch.randint(0, c.vocab_size, (48, SEQ), generator=torch.Generator().manual_seed(0))
    budget = recipe_budget(init, calib_tokens, calib_tokens and max(SEQ, calib_tokens // 8), steps)
    before = {k: v.clone() for k, v in list(teacher.state_dict().items())[:4]}
    with Stage(st, 'calibrate'):
        hybrid = calibrate(teacher, ids, init=init, calib_tokens=budget['calib_tokens'], heldout_tokens=budget['heldout_tokens'],
                           steps=budget['steps'], progress=False)
    rep = hybrid.calibration_report
    res = dict(shape=name, init=init, malloc=_malloc(), quick=quick, dtype=dtype, device=str(device), threads=torch.get_num_threads(),
               params=sum(p.numel() for p in teacher.parameters()), weight_mb=round(weight_bytes / 2**20), budget=budget,
               timings={k: round(v, 2) for k, v in rep.timings.items()}, converted=rep.converted,
               shared_weights=len(shared_weights(hybrid)),
               teacher_unchanged=all(torch.equal(v, teacher.state_dict()[k]) for k, v in before.items()), stages=st)
    if init == 'taylor':   # the building blocks on their own
        with Stage(st, 'statistics'):
            stats = attention_stats(teacher, ids[:4].to(device), progress=False)
        assert len(stats.mean_distance) == c.num_hidden_layers and len(stats.mean_distance[0]) == c.num_attention_heads
        del stats
        with Stage(st, 'convert_copy'): copied = to_hybrid(teacher, 'uniform:0.25')
        del copied
        with Stage(st, 'convert_shared'): shared = to_hybrid(teacher, 'uniform:0.25', share_weights=True)
        del shared
        return res
    out = Path(tempfile.mkdtemp())
    with Stage(st, 'save'): save_hybrid(hybrid, out / 'hybrid')
    with Stage(st, 'load'): loaded = load_hybrid(out / 'hybrid').to(device)
    prompt = ids[:1, :32].to(device)
    with Stage(st, 'generate'): gen = loaded.generate(prompt, max_new_tokens=16, do_sample=False)
    with torch.no_grad(): res['loaded_logits_equal'] = torch.equal(loaded(prompt).logits, hybrid(prompt).logits)
    res.update(save_mb=round(sum(f.stat().st_size for f in (out / 'hybrid').iterdir()) / 2**20),
               generated_tokens=int(gen.shape[1] - prompt.shape[1]),
               generate_matches_in_memory=torch.equal(gen, hybrid.generate(prompt, max_new_tokens=16, do_sample=False)))
    return res


def summarise(runs, quick):
    "Per-shape table, the cost model fitted to the measured stages, and its extrapolation to the larger shapes."
    import torch
    rows, fit = [], {'teacher': [], 'phase2': []}
    for r in runs:
        c, t = config_for(r['shape'], quick), r['timings']
        m = cost_model(c, r['init'], r['budget'], 2 if r['dtype'] == 'bfloat16' else 4)
        fit['teacher'].append((m['teacher_flops'], t['statistics_s']))
        if m['phase2_flops']: fit['phase2'].append((m['phase2_flops'], t['phase2_s']))
        rows.append(dict(shape=r['shape'], init=r['init'], malloc=r['malloc'], **{k: r['budget'][k] for k in ('calib_tokens', 'heldout_tokens', 'steps')},
                         total_s=t['total_s'], statistics_s=t['statistics_s'], phase2_s=t['phase2_s'],
                         weight_mb=r['weight_mb'], extra_mb=r['stages']['calibrate']['extra_mb'],
                         extra_x_teacher=round(r['stages']['calibrate']['extra_mb'] / r['weight_mb'], 3),
                         gdn_mb=round(m['gdn_mb']),
                         working_x_teacher=round((r['stages']['calibrate']['extra_mb'] - m['gdn_mb']) / r['weight_mb'], 3),
                         capture_groups=m['capture_groups'], teacher_gflop=round(m['teacher_flops'] / 1e9),
                         phase2_gflop=round(m['phase2_flops'] / 1e9)))
    # one sustained rate per stage kind: total FLOPs / total seconds over all measured runs
    rate = {k: sum(f for f, _ in v) / max(1e-9, sum(s for _, s in v)) for k, v in fit.items() if v}
    for row in rows:
        m_t = row['teacher_gflop'] * 1e9 / rate['teacher']
        m_p = row['phase2_gflop'] * 1e9 / rate['phase2'] if row['phase2_gflop'] else 0.
        row.update(model_statistics_s=round(m_t, 1), model_phase2_s=round(m_p, 1))
    extrapolated = []
    for name in EXTRAPOLATE:
        c = config_for(name)
        wb = all_params(c) * 2   # bf16 teacher
        for init in ('taylor', 'taylor+'):
            b = recipe_budget(init)
            m = cost_model(c, init, b, dtype_bytes=2)
            t = m['teacher_flops'] / GPU_RATE['teacher_flops_per_s'] + m['phase2_flops'] / GPU_RATE['phase2_flops_per_s']
            extrapolated.append(dict(shape=name, init=init, params_b=round(all_params(c) / 1e9, 2), converted=m['converted'],
                                     steps=b['steps'], teacher_tflop=round(m['teacher_flops'] / 1e12, 1),
                                     phase2_tflop=round(m['phase2_flops'] / 1e12, 1), gpu_seconds_flops_bound=round(t, 1),
                                     teacher_bf16_gb=round(wb / 2**30, 2), gdn_bf16_gb=round(m['gdn_mb'] / 1024, 2),
                                     capture_gb_per_layer=round(m['capture_mb_per_layer'] / 1024, 2), capture_groups=m['capture_groups']))
    return dict(rows=rows, cpu_rate_gflop_s={k: round(v / 1e9, 2) for k, v in rate.items()}, gpu_assumption=GPU_RATE,
                paper_seconds_per_student=PAPER_S, extrapolated=extrapolated)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--shapes', nargs='+', default=RUN, choices=RUN + ['SmolLM2-135M'])
    p.add_argument('--inits', nargs='+', default=['taylor+', 'taylor'], choices=INITS)
    p.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'])
    p.add_argument('--steps', type=int, default=4, help='Phase-2 steps per layer (the recipes use 300)')
    p.add_argument('--calib-tokens', type=int, default=None, help="calibration tokens (held-out: an eighth); default: each recipe's own")
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--quick', action='store_true', help='shrunken shapes: checks the script, measures nothing')
    p.add_argument('--out', default=str(RESULTS))
    p.add_argument('--merge', nargs='+', default=None, help='results files of other calls: add their runs to --out and summarise')
    p.add_argument('--one', default=None, help=argparse.SUPPRESS)
    p.add_argument('--init', default=None, help=argparse.SUPPRESS)
    p.add_argument('--device', default='cpu', help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.quick: a.calib_tokens, a.steps = a.calib_tokens or 1024, min(a.steps, 2)
    if a.one:
        import torch; torch.set_num_threads(a.threads)
        print('RESULT ' + json.dumps(measure(a.one, a.init, a.dtype, a.steps, a.calib_tokens, a.quick, a.device)))
        return
    out = Path(a.out)
    key = lambda r: (r['shape'], r['init'], r['malloc'])
    todo = [(n, i, _malloc()) for n in a.shapes for i in a.inits]
    # runs of other (shape, init, malloc) keys already in the results file are kept: shapes can be measured in separate calls
    runs = [r for r in (json.loads(out.read_text())['runs'] if out.exists() else []) if a.merge or key(r) not in todo]
    if a.merge:
        new = [r for f in a.merge for r in json.loads(Path(f).read_text())['runs']]
        runs = [r for r in runs if key(r) not in {key(n) for n in new}] + new
        out.write_text(json.dumps(dict(meta=dict(cpu_count=os.cpu_count()), runs=runs, **summarise(runs, a.quick)), indent=1))
        return
    for name, init, _ in todo:
        cmd = [sys.executable, __file__, '--one', name, '--init', init, '--dtype', a.dtype, '--steps', str(a.steps), '--threads', str(a.threads)]
        if a.calib_tokens: cmd += ['--calib-tokens', str(a.calib_tokens)]
        if a.quick: cmd.append('--quick')
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode: raise SystemExit(f'{name} failed:\n{r.stderr[-4000:]}')
        runs.append(json.loads([l for l in r.stdout.splitlines() if l.startswith('RESULT ')][-1][7:]))
        print(f'{name} {init}: {time.time() - t0:.0f} s', flush=True)
        runs[-1]['argv'], runs[-1]['loadavg'] = sys.argv[1:], os.getloadavg()
        res = dict(meta=dict(cpu_count=os.cpu_count(), dtype=a.dtype), runs=runs, **summarise(runs, a.quick))
        out.parent.mkdir(parents=True, exist_ok=True); out.write_text(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
