"""What Phase 2 does from each start on the real teacher: per converted layer, the fit to the teacher's attention output
(MSE, cosine, amplitude) where Phase 2 starts and where it ends, and each head's decay half-life and write strength before
and after, read from the calibration reports that `scripts/experiments.py` keeps beside its ledger.

    python scripts/phase1_mechanism.py --teacher smollm2-135m     # -> bench/results/phase1_mechanism_smollm2-135m.json

A pair is (the run that holds the start, the run whose Phase 2 starts there): the naive copy and `phase2`, the paper's
Phase 1 alone and `taylor`, and the same for taylor+'s Phase 2 (from the copy, `taylor+ without phase1`; from Phase 1,
`taylor+`), at one seed. Half-lives and write strengths are medians over each layer's heads; a start's come from the
start's own run (the copy's or Phase 1's), an end's from the Phase-2 run. The same-named budget and gauge runs of the
'mechanism' part give the perplexity of each start by Phase 2's step cap (30, 100, 300, and 1,000 where run) and at value/output gauges 10 and 100.
"""
import argparse, gzip, json, statistics, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/'scripts'))
from experiments import read_jsonl, relabel, report_path, recipe_id, recipe_of, MECHANISM_STEPS, MECHANISM_INITS, GAUGES, GAUGE_INITS

PAIRS = (('naive', 'phase2'), ('taylor_phase1', 'taylor'), ('taylor+ without phase1', 'taylor+ without phase1'), ('phase1', 'taylor+'))

def rows_by_init(ledger_dir, keep='uniform:0.25', seed=0):
    "The ledger's current zero-shot rows at `keep` and `seed`, by init (rows of an older recipe of the same name left out)."
    out = {}
    for r in map(relabel, read_jsonl(Path(ledger_dir)/'runs.jsonl')):
        j = r['job']
        if j['kind'] != 'zero_shot' or j['keep'] != keep or j['seed'] != seed or j.get('kv_copy', 'heads') != 'heads': continue
        try: now = recipe_id(j['init'])
        except ValueError: continue                              # an ablated switch today's taylor+ lacks
        if r.get('recipe_id', now) != now: continue
        out[j['init']] = r
    return out

def report(ledger_dir, row):
    "A run's calibration report (a renamed row's under its old key); None where the ledger kept none (zero-shot rows older than the reports)."
    path = report_path(ledger_dir, row)
    if not path.exists(): return None
    with gzip.open(path, 'rt') as f: return json.load(f)

def medians(rep, field):
    "Per layer, the median of `field` over its heads."
    by = {}
    for h in (rep or {}).get('heads', ()): by.setdefault(h['layer'], []).append(h[field])
    return {l: statistics.median(v) for l, v in by.items() if all(x is not None for x in v)}

def stage_of(rep):
    "The stage a report's start is measured at: Phase 1 where it ran, else the copy."
    return 'phase1' if rep['recipe'].get('phase1') else 'copy'

def pair_table(ledger_dir, rows, start, end):
    "Per layer: where `end`'s Phase 2 starts (its report's copy or Phase-1 fit) and ends, and the heads' median half-life and write strength before (the `start` run) and after."
    if start not in rows or end not in rows: return None
    s_rep, e_rep = report(ledger_dir, rows[start]), report(ledger_dir, rows[end])
    st = 'copy' if start == end else stage_of(e_rep)
    hl0, hl1, b0, b1 = medians(s_rep, 'half_life'), medians(e_rep, 'half_life'), medians(s_rep, 'beta'), medians(e_rep, 'beta')
    if start == end: hl0 = b0 = {}                              # the copy's dynamics are the run's own before Phase 2: not recorded
    out = []
    for L in e_rep['layers']:
        l = L['layer']
        out.append(dict(layer=l, **{f'{k}_start': L.get(f'{k}_{st}') for k in ('mse', 'cos', 'ratio')},
                        **{f'{k}_end': L.get(f'{k}_phase2') for k in ('mse', 'cos', 'ratio')},
                        half_life_start=hl0.get(l), half_life_end=hl1.get(l), beta_start=b0.get(l), beta_end=b1.get(l),
                        best_step=L.get('phase2_best_step'), stopped=L.get('phase2_stopped')))
    return dict(start=start, end=end, start_stage=st, test_ppl=rows[end]['ppl'], valid_ppl=rows[end].get('valid_ppl'),
                start_test_ppl=rows[start]['ppl'] if start != end else None, layers=out)

CELL_INITS = ('naive', 'zero_gate', 'taylor_phase1', 'phase1', 'phase2', 'taylor', 'taylor+ without phase1', 'taylor+',
              'taylor+ with gauge_fix', 'taylor+ with rates x4', 'taylor+ with steps=300')   # the last three: taylor+'s variants

def cells(ledger_dir, keep, seeds=(0, 1, 2)):
    "Per init at `keep`: the current rows' TEST and VALID perplexities by seed, their means over the seeds run, and the median run time."
    by_seed = {s: rows_by_init(ledger_dir, keep, s) for s in seeds}
    out = {}
    for i in CELL_INITS:
        rs = {s: r[i] for s, r in by_seed.items() if i in r}
        if not rs: continue
        test, valid = {s: r['ppl'] for s, r in rs.items()}, {s: r.get('valid_ppl') for s, r in rs.items() if r.get('valid_ppl')}
        out[i] = dict(seeds=sorted(rs), test=test, valid=valid, test_mean=statistics.mean(test.values()),
                      valid_mean=statistics.mean(valid.values()) if valid else None,
                      seconds_median=statistics.median(r['seconds'] for r in rs.values() if r.get('seconds')) if any(r.get('seconds') for r in rs.values()) else None)
    return out

def by_steps(rows, init, field):
    "`init`'s perplexity (`field`) by Phase 2's step cap: its own recipe's run at its own cap, the '<init> with steps=N' runs at N."
    runs = {n: rows.get(f'{init} with steps={n}') for n in (*MECHANISM_STEPS, 300, 1000)} | {recipe_of(init).steps: rows.get(init)}
    return {n: r.get(field) for n, r in sorted(runs.items()) if r is not None}

def main(a):
    d = ROOT/'bench'/'results'/f'experiments_{a.teacher}'
    rows = rows_by_init(d)
    out = dict(teacher=a.teacher, ledger=str(d.relative_to(ROOT)), seed=0,
               cells={keep: cells(d, keep) for keep in ('uniform:0.25', 'ar:0.25')}, pairs={f'{s} -> {e}': pair_table(d, rows, s, e) for s, e in PAIRS},
               budget={i: by_steps(rows, i, 'valid_ppl') for i in MECHANISM_INITS},
               budget_test={i: by_steps(rows, i, 'ppl') for i in MECHANISM_INITS},
               gauge={i: {k: rows[f'{i} at gauge x{k}']['ppl'] if f'{i} at gauge x{k}' in rows else None for k in GAUGES}
                      | {1: rows[i]['ppl'] if i in rows else None} for i in GAUGE_INITS})
    path = ROOT/'bench'/'results'/f'phase1_mechanism_{a.teacher}.json'
    path.write_text(json.dumps(out, indent=1)); print('wrote', path)

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--teacher', default='smollm2-135m')
    main(p.parse_args())
