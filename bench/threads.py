"""CPU threads and wall time: the demo and the Quick start as README.md gives them, against the same work at 2 threads and at
torch's default (one thread per core), on a machine where other processes keep cores busy.

Parts, each three variants: README's form, 2 threads, torch's default. A round runs every part's variants in turn
(ABC ABC ABC, parts one after another), and rounds repeat `--reps` times, or until `--max-minutes` have passed; every run is
a fresh process. The reduced forms keep each step's work (the same windows per step, at the same widths) and take fewer steps:
- `demo`: `taylor-calibrate demo` as README gives it (`--threads auto`), with `--threads 2`, and with `--threads 0` (torch's
  default), reduced to `--inits naive,taylor --steps 2 --eval-tokens 4096` (README's form calibrates four inits, `taylor`
  and `taylor+` with up to 300 Phase-2 steps a layer, and evaluates on 32,768 tokens);
- `quickstart`: README's Quick start, its Python block read from README.md and run as it stands (with its
  `torch.set_num_threads(1)`), with that line at 2 threads, and without it (torch's default); reduced to
  `calib_tokens=2048, steps=2` in `calibrate` (taylor+ trains on mini-batches of 2,048 tokens either way) and
  `max_tokens=4096` in `perplexity`;
- `wide`: `taylor-calibrate convert` of a teacher of Qwen2.5-0.5B's width (hidden size 896, 14 heads, 2 KV heads, MLP 4,864;
  4 layers, random weights, the shipped tokenizer) with `--init taylor --calib-tokens 1024 --steps 2 --no-eval`, at
  `--threads auto` (the cores not busy at its start), 2 and 0;
- `full`: the Quick start exactly as README gives it, once, after the rest (the demo's full run is
  bench/results/demo_output.txt).

Each run records its wall seconds, the thread count it ran at (the command's `threads:` line, or what the Quick start's
process reports), `os.getloadavg()` before and after, and `others_cores`: the CPU time other processes used during the run
(/proc/stat's busy time less the run's own CPU time), in cores. The summary gives each variant's median and its ratio to the
README form's median.

Run: `python bench/threads.py` (writes bench/results/threads.json; `--max-minutes` bounds it, 60 by default);
`--parts demo,quickstart --reps 1` for a shorter look.
"""
import argparse, itertools, json, os, platform, re, resource, statistics, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT/'bench'/'results'/'threads.json'
EXE = str(Path(sys.executable).with_name('taylor-calibrate'))
REDUCED_STEPS, REDUCED_EVAL, REDUCED_CALIB = 2, 4096, 2048
WIDE = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=4, num_attention_heads=14, num_key_value_heads=2,
            max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True)

def quickstart_code() -> str:
    "README's Quick start: the first Python block that calls calibrate on the shipped corpus, as README.md gives it."
    blocks = re.findall(r'```python\n(.*?)```', (ROOT/'README.md').read_text(encoding='utf-8'), re.S)
    return next(b for b in blocks if 'calibrate(teacher, "train"' in b)

def _sub(code: str, old: str, new: str) -> str:
    assert code.count(old) == 1, f'README\'s Quick start no longer has {old!r}: update bench/threads.py'
    return code.replace(old, new)

def quickstart_variants(code: str, reduced: bool) -> dict:
    "The Quick start as README gives it, at 2 threads, and without its thread line (torch's default)."
    line = 'torch.set_num_threads(1)'
    if reduced:
        code = _sub(code, 'tokenizer=tok)', f'tokenizer=tok, calib_tokens={REDUCED_CALIB}, steps={REDUCED_STEPS})')
        code = _sub(code, 'perplexity(student, tok, "test")', f'perplexity(student, tok, "test", max_tokens={REDUCED_EVAL})')
    code += "\nimport torch as _t; print(f'threads: {_t.get_num_threads()}')\n"
    assert line in code, f'README\'s Quick start has no {line}'
    no_line = '\n'.join(l for l in code.splitlines() if not l.lstrip().startswith(line))
    return {'readme': code, 'threads_2': code.replace(line, 'torch.set_num_threads(2)'), 'torch_default': no_line}

def wide_teacher(folder: Path) -> Path:
    "A teacher of Qwen2.5-0.5B's width, 4 layers deep, random weights, with the shipped tokenizer."
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from taylor_calibrate.teacher import load_teacher
    _, tok = load_teacher()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), **WIDE))
    model.save_pretrained(folder); tok.save_pretrained(folder)
    return folder

def _cpu_busy_s() -> float:
    "Seconds of CPU time all processes have used since boot (/proc/stat, all cores; 0 where there is none)."
    try: f = Path('/proc/stat').read_text().splitlines()[0].split()[1:]
    except OSError: return 0.0
    v = [int(x) for x in f]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf('SC_CLK_TCK')   # all but idle and iowait

def timed(cmd, env=None, cwd=None) -> dict:
    "Run `cmd` once: wall seconds, thread count, load average around it, other processes' CPU use meanwhile."
    before, busy0 = os.getloadavg(), _cpu_busy_s()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if r.returncode: raise SystemExit(f'{cmd} failed:\n{r.stderr[-3000:]}')
    m = re.search(r'^threads: (\d+)', r.stdout, re.M)
    return dict(wall_s=round(wall, 2), threads=int(m[1]) if m else None, cpu_s=round(own, 2), loadavg_before=[round(x, 2) for x in before],
                loadavg_after=[round(x, 2) for x in os.getloadavg()],
                others_cores=round(max(0.0, (_cpu_busy_s() - busy0 - own) / wall), 2), stdout_head=r.stdout.splitlines()[:3])

_RUN = itertools.count()   # numbers every run's output folder

def variants(part: str, tmp: Path) -> dict:
    "name -> a function that runs the variant once, in a fresh output folder."
    env = {k: v for k, v in os.environ.items() if k not in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')}   # as a user's shell has it
    out = lambda: str(tmp/f'{part}-{next(_RUN)}')
    if part in ('demo', 'full_demo'):
        extra = [] if part == 'full_demo' else ['--inits', 'naive,taylor', '--steps', str(REDUCED_STEPS), '--eval-tokens', str(REDUCED_EVAL)]
        forms = {'readme': [], 'threads_2': ['--threads', '2'], 'torch_default': ['--threads', '0']}
        if part == 'full_demo': forms = {'readme': []}
        return {k: (lambda a=a: timed([EXE, 'demo', *extra, *a, '--out', out()], env)) for k, a in forms.items()}
    if part in ('quickstart', 'full_quickstart'):
        codes = quickstart_variants(quickstart_code(), reduced=part == 'quickstart')
        if part == 'full_quickstart': codes = {'readme': codes['readme']}
        return {k: (lambda c=c: timed([sys.executable, '-c', c], env, cwd=tmp)) for k, c in codes.items()}
    if part == 'wide':
        teacher = wide_teacher(tmp/'wide_teacher')
        base = [EXE, 'convert', '--teacher', str(teacher), '--init', 'taylor', '--calib-tokens', '1024', '--steps', str(REDUCED_STEPS),
                '--no-eval']
        forms = {'readme': [], 'threads_2': ['--threads', '2'], 'torch_default': ['--threads', '0']}
        return {k: (lambda a=a: timed([*base, *a, '--out', out()], env)) for k, a in forms.items()}
    raise ValueError(part)

def summarise(runs: list) -> dict:
    out = {}
    for part in dict.fromkeys(r['part'] for r in runs):
        rs = [r for r in runs if r['part'] == part]
        med = {v: statistics.median(r['wall_s'] for r in rs if r['variant'] == v) for v in dict.fromkeys(r['variant'] for r in rs)}
        out[part] = {v: dict(median_s=round(m, 1), ratio_to_readme=round(m / med['readme'], 2), n=sum(r['variant'] == v for r in rs),
                             threads=statistics.median(r['threads'] for r in rs if r['variant'] == v),
                             loadavg_1min=[min(r['loadavg_before'][0] for r in rs if r['variant'] == v),
                                           max(r['loadavg_after'][0] for r in rs if r['variant'] == v)],
                             others_cores_median=statistics.median(r['others_cores'] for r in rs if r['variant'] == v))
                     for v, m in med.items()}
    return out

def machine(runs: list) -> dict:
    import torch
    cpu = next((l.split(':', 1)[1].strip() for l in Path('/proc/cpuinfo').read_text().splitlines() if l.startswith('model name')),
               platform.processor()) if Path('/proc/cpuinfo').exists() else platform.processor()
    loads = [x for r in runs for x in (r['loadavg_before'][0], r['loadavg_after'][0])]
    others = [r['others_cores'] for r in runs]
    return dict(cpu=cpu, cores=os.cpu_count(), torch=torch.__version__, torch_default_threads=torch.get_num_threads(),
                python=platform.python_version(),
                summary=(f'{os.cpu_count()} CPU cores ({cpu}), torch {torch.__version__} (default {torch.get_num_threads()} threads); '
                         f'loaded: 1-minute load average {min(loads):.1f} to {max(loads):.1f} around the runs, other processes '
                         f'using {statistics.median(others):.1f} cores (median over runs) while they ran'))

def _package() -> str:
    "Where the runs import taylor_calibrate from (PYTHONPATH may name a copy of the tree, so that edits made while the bench runs stay out)."
    r = subprocess.run([sys.executable, '-c', 'import taylor_calibrate as t; print(t.__file__, t.__version__)'], capture_output=True, text=True)
    return r.stdout.strip() + (f" (PYTHONPATH={os.environ['PYTHONPATH']})" if os.environ.get('PYTHONPATH') else '')

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--parts', default='demo,quickstart,wide,full', help='comma list of demo, quickstart, wide, full')
    p.add_argument('--reps', type=int, default=3, help='rounds of every part\'s alternating variants')
    p.add_argument('--max-minutes', type=float, default=60, help='start no new round after this many minutes')
    p.add_argument('--out', default=str(RESULTS))
    a = p.parse_args()
    parts = a.parts.split(',')
    runs, t_start, qs = [], time.time(), quickstart_code()
    res = lambda: dict(machine=machine(runs), settings=dict(
        reps=a.reps, max_minutes=a.max_minutes, rounds_done=1 + max([r['rep'] for r in runs if not r['part'].startswith('full')], default=-1),
        parts=parts, reduced=dict(demo=['--inits', 'naive,taylor', '--steps', REDUCED_STEPS, '--eval-tokens', REDUCED_EVAL],
                                  quickstart=dict(calib_tokens=REDUCED_CALIB, steps=REDUCED_STEPS, max_tokens=REDUCED_EVAL),
                                  note="each step's work kept, fewer steps; full runs README's Quick start as given"),
        wide_teacher=WIDE, package=_package(), quickstart=qs, demo=[Path(EXE).name, 'demo'], argv=sys.argv[1:], total_s=round(time.time() - t_start)),
        summary=summarise(runs), runs=runs)
    def record(part, name, rep, run):
        r = dict(part=part, variant=name, rep=rep, **run())
        runs.append(r)
        print(f"{part:16} {name:14} rep {rep}: {r['wall_s']:8.1f} s at {r['threads']} threads, load "
              f"{r['loadavg_before'][0]:.2f} -> {r['loadavg_after'][0]:.2f}, others {r['others_cores']:.2f} cores", flush=True)
        Path(a.out).write_text(json.dumps(res(), indent=1))
    with tempfile.TemporaryDirectory() as d:
        vs = {part: variants(part, Path(d)) for part in parts if part != 'full'}
        for rep in range(a.reps):
            if rep and time.time() - t_start > 60 * a.max_minutes: break
            for part, fs in vs.items():
                for name, run in fs.items(): record(part, name, rep, run)
        if 'full' in parts:
            for name, run in variants('full_quickstart', Path(d)).items(): record('full_quickstart', name, 0, run)
    Path(a.out).write_text(json.dumps(res(), indent=1))
    print(json.dumps(res()['summary'], indent=1))

if __name__ == '__main__':
    main()
