"""The value/output gauge experiment: one teacher rescaled by k (W_V / k, k W_O; the same function), then converted
with every initialisation. Calibration on TRAIN, evaluation on the whole TEST split.

    python scripts/gauge_sweep.py --workers 2           # the full sweep -> bench/results/gauge/
    python scripts/gauge_sweep.py --mini --out-dir /tmp/g   # a few steps of everything (checks the code path)
    python scripts/gauge_sweep.py --summarise-only      # rewrite gauge.json from the runs finished so far
    python scripts/gauge_sweep.py --teacher smollm2-135m --eval-tokens 8192 --inits naive,zero_gate,taylor_phase1 --seeds 1
                                                        # the cheap inits on the real teacher -> bench/results/gauge_smollm2-135m/

Runs: k in {0.1, 0.3, 1, 3, 10, 30, 100} x inits {naive, zero_gate, taylor_phase1 (the paper's Phase 1 alone), phase2, taylor,
taylor+} with `uniform:0.25`;
`taylor+` both with and without its `gauge_fix` switch; at k = 10 (inside the range of context sizes logged for
Llama-3.2-3B) the retention sweep 25/50/75% for naive, taylor and taylor+. Seed 0 of everything first, then the
other seeds. Every finished run is one line of `<out-dir>/runs.jsonl` (the same resumable ledger as
`scripts/experiments.py`): an interrupted sweep continues where it stopped. `<out-dir>/gauge.json` summarises it.
Each row carries the fingerprint of the recipe it ran (`gauge_fix` included); a row whose init names another recipe
today is run again, and rows of the paper's Phase 1 written as `phase1` are read as `taylor_phase1`, as
`scripts/experiments.py` reads its ledger. The committed summaries (`bench/results/gauge*/gauge.json`, read by 05a, 08
and `scripts/gap_closed.py`) name the paper's Phase 1 alone `phase1` and hold `taylor+` started from the paper's mappings
(the recipe of 08's grids); `--summarise-only` rewrites a summary under today's names and recipes.
"""
import argparse, json, math, statistics, sys, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/'scripts'))
import experiments
from experiments import fingerprint, recipe_of, append_ledger, claim, job_key, run_workers, _summ

KS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
INITS = ('naive', 'zero_gate', 'taylor_phase1', 'phase2', 'taylor', 'taylor+')
ORDER = (1.0, 100.0, 0.1, 10.0, 30.0, 0.3, 3.0)   # the expensive inits: the extremes and the real-model range first
RETENTION_K, RETENTION, RETENTION_INITS = 10.0, (0.25, 0.5, 0.75), ('naive', 'taylor', 'taylor+')
LLAMA_CONTEXT_RMS = (0.017, 0.145)      # teacher context RMS range in the reference implementation's Llama-3.2-3B logs
                                        # (`teacher_rms` of its Phase-1 log lines, GA-S2 layer-selection probe, released results)

def job(k, init, seed, keep='uniform:0.25', gauge_fix=False):
    return dict(kind='gauge', k=k, init=init, seed=seed, keep=keep, gauge_fix=gauge_fix)

def jobs(seeds, ks=KS):
    """Seed 0 of everything (cheap inits first, then both taylor+ variants at k=1, then the expensive inits in `ORDER` of k),
    then the other seeds cell by cell, the cells the reading rests on first (naive, taylor, taylor+ at every k)."""
    def seed0():
        cheap = [job(k, i, 0) for i in INITS[:3] for k in ks]
        plus = [job(1.0, 'taylor+', 0, gauge_fix=g) for g in (False, True)]
        rest = [job(k, i, 0, gauge_fix=g) for k in sorted(ks, key=ORDER.index) for i, g in
                [('taylor', False), ('taylor+', False), ('taylor+', True), ('phase2', False)]]
        return cheap + plus + rest + retention([0])
    def retention(ss):
        return [job(RETENTION_K, i, s, keep=f'uniform:{f}', gauge_fix=g) for s in ss for f in RETENTION
                for i, g in [('naive', False), ('taylor', False), ('taylor+', False), ('taylor+', True)]]
    cells = [('naive', False), ('taylor', False), ('taylor+', True), ('zero_gate', False), ('taylor_phase1', False),
             ('taylor+', False), ('phase2', False)]
    others = list(range(1, seeds))
    later = [job(k, i, s, gauge_fix=g) for i, g in cells for k in sorted(ks, key=ORDER.index) for s in others] + retention(others)
    todo = seed0() + later
    return list({job_key(j): j for j in todo}.values())

def job_recipe(j):
    "The recipe a gauge job runs: its init's recipe with the job's `gauge_fix`."
    from dataclasses import replace
    return replace(recipe_of(j['init']), gauge_fix=j['gauge_fix'])

def recipe_id(j): return fingerprint(job_recipe(j))

def read_ledger(out_dir, setup_id):
    "The sweep's rows of `setup_id` whose recipe (`gauge_fix` included) is the one their job names now, by key."
    return experiments.read_ledger(out_dir, setup_id, recipe_id)

def budget(a): return dict(steps=3, calib_tokens=1024, heldout_tokens=512) if a.mini else {}

def run(j, teacher, tok, test_ids, a):
    from taylor_calibrate.core import calibrate, rescale_value_output
    from taylor_calibrate.teacher import perplexity
    t = rescale_value_output(teacher, j['k'])
    student = calibrate(t, 'train', keep=j['keep'], init=job_recipe(j), tokenizer=tok, seed=j['seed'], progress=False, **budget(a))
    rep = student.calibration_report
    return dict(ppl=perplexity(student, test_ids, progress=False), kept=rep.keep, layers=rep.layers, timings=rep.timings)

def setup_of(a, test_ids):
    import hashlib
    s = dict(experiment='gauge', teacher=a.teacher, eval_split='test', eval_tokens=test_ids.numel(), calib_split='train',
             mini=a.mini, budget=budget(a), torch=torch.__version__)
    return s, hashlib.sha1(json.dumps(s, sort_keys=True).encode()).hexdigest()[:12]

def load(a):
    from taylor_calibrate.teacher import load_teacher, corpus_token_ids
    teacher, tok = load_teacher(a.teacher)
    return teacher, tok, corpus_token_ids(tok, 'test', 2048 if a.mini else a.eval_tokens)

def todo(a):
    "The run list, cut to `--inits` when given."
    return [j for j in jobs(a.seeds, a.ks) if a.inits is None or j['init'] in a.inits.split(',')]

def work(a):
    teacher, tok, test_ids = load(a)
    setup, sid = setup_of(a, test_ids)
    for j in todo(a):
        key = job_key(j)
        if key in read_ledger(a.out_dir, sid) or not claim(a.out_dir, key): continue
        t0 = time.time()
        res = run(j, teacher, tok, test_ids, a)
        append_ledger(a.out_dir, dict(key=key, setup_id=sid, job=j, recipe_id=recipe_id(j), seconds=time.time() - t0, **res))
        print(f"k {j['k']:6g} {j['keep']:13} {j['init']:9} gauge_fix {j['gauge_fix']!s:5} seed {j['seed']}  ppl {res['ppl']:9.2f} "
              f"({time.time() - t0:.0f}s)", flush=True)


def summarise(ledger, setup, teacher_ppl):
    "Mean and spread over seeds per (keep, init, gauge_fix, k), the naive/taylor ratio per k, and the per-layer branch ratios (mean over layers)."
    cells = {}
    for r in ledger.values():
        j = r['job']
        name = j['init'] + (' (gauge_fix)' if j['gauge_fix'] else '')
        cells.setdefault((j['keep'], name, j['k']), []).append(r)
    out = {}
    for (keep, name, k), rs in sorted(cells.items(), key=lambda t: (t[0][0], t[0][1], t[0][2])):
        rs = sorted(rs, key=lambda r: r['job']['seed'])
        ratios = {s: statistics.mean([l[f'ratio_{s}'] for l in rs[0]['layers']]) for s in ('copy', 'phase1', 'phase2') if f'ratio_{s}' in rs[0]['layers'][0]}
        out.setdefault(keep, {}).setdefault(name, {})[str(k)] = dict(**_summ([r['ppl'] for r in rs]), seeds=[r['job']['seed'] for r in rs],
                                                                   branch_ratio=ratios, seconds=statistics.median(r['seconds'] for r in rs))
    u = out.get('uniform:0.25', {})
    naive_over_taylor = {k: u['naive'][k]['mean'] / u['taylor'][k]['mean'] for k in u.get('naive', {}) if k in u.get('taylor', {})}
    return dict(setup=setup, teacher_test_ppl=teacher_ppl, llama_context_rms=LLAMA_CONTEXT_RMS, runs=out,
                naive_over_taylor=naive_over_taylor)

def main(a):
    torch.set_num_threads(a.threads); torch.set_flush_denormal(True)
    if run_workers(a, work, __file__): return
    out_dir = Path(a.out_dir)
    from taylor_calibrate.teacher import perplexity
    teacher, tok, test_ids = load(a)
    setup, sid = setup_of(a, test_ids)
    ledger = read_ledger(out_dir, sid)
    missing = [job_key(j) for j in todo(a) if job_key(j) not in ledger]
    res = summarise(ledger, dict(setup, seeds=a.seeds, runs_done=len(ledger), runs_missing=missing), perplexity(teacher, test_ids, progress=False))
    (out_dir/'gauge.json').write_text(json.dumps(res, indent=1, default=float)); print('wrote', out_dir/'gauge.json')
    return res

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--teacher', default=None, help='a shipped teacher name (default: the default teacher)')
    p.add_argument('--mini', action='store_true', help='tiny budgets: checks the code path, measures nothing')
    p.add_argument('--seeds', type=int, default=3)
    p.add_argument('--ks', type=float, nargs='+', default=list(KS))
    p.add_argument('--threads', type=int, default=1, help='threads in all (split between the workers)')
    p.add_argument('--workers', type=int, default=1, help='processes sharing the run list')
    p.add_argument('--worker', type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument('--summarise-only', action='store_true', help='run nothing: summarise the runs already in the ledger')
    p.add_argument('--inits', default=None, help='run only these inits (comma list; default: all)')
    p.add_argument('--eval-tokens', type=int, default=None, help='test tokens per evaluation (default: the whole test split)')
    p.add_argument('--out-dir', default=None, help='default: bench/results/gauge/ (default teacher) or bench/results/gauge_<teacher>/')
    a = p.parse_args()
    a.ks = tuple(a.ks)
    if a.out_dir is None: a.out_dir = str(ROOT/'bench'/'results'/('gauge' if a.teacher in (None, 'tiny-qwen2') else f'gauge_{a.teacher}'))
    if a.mini: a.seeds = 1
    main(a)
