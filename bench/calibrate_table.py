"""Calibration on the shipped teacher: test perplexity of every init, the taylor+ ablation, and timings.

    python bench/calibrate_table.py                 # full run, writes bench/results/calibrate.json
    python bench/calibrate_table.py --quick         # tiny budgets (CI smoke test), writes nothing unless --out

6 of 8 layers converted (uniform:0.25 keeps layers 0 and 4); calibration on the TRAIN split, Phase-2
early stopping on held-out windows of the TRAIN split, evaluation on the whole TEST split. Seeds 0..S-1.
"""
import argparse, json, math, platform, statistics, sys, time
from dataclasses import replace
from pathlib import Path
import torch
from taylor_calibrate.teacher import load_teacher, perplexity, corpus_token_ids
from taylor_calibrate.core import calibrate, RECIPES

ABLATIONS = ('exact_decay', 'exact_beta', 'acting_scale', 'minibatch')

def run(inits, seeds, eval_tokens, overrides, ablate):
    teacher, tok = load_teacher()
    test_ids = corpus_token_ids(tok, 'test', eval_tokens)
    out = dict(setup=dict(keep='uniform:0.25', calib_split='train', eval_split='test', eval_tokens=test_ids.numel(),
                          seeds=seeds, torch=torch.__version__, threads=torch.get_num_threads(), machine=platform.machine()),
               teacher_ppl=perplexity(teacher, test_ids, progress=False), runs={})
    print(f'teacher {out["teacher_ppl"]:.2f}', flush=True)
    recipes = {i: RECIPES[i] for i in inits}
    if ablate:
        for a in ABLATIONS:
            r = RECIPES['taylor+']
            kw = {a: False}
            if a == 'minibatch': kw.update(calib_tokens=RECIPES['taylor'].calib_tokens, heldout_tokens=RECIPES['taylor'].heldout_tokens, batch_windows=0, patience=0)
            recipes[f'taylor+ without {a}'] = replace(r, name=f'taylor+ without {a}', **kw)
    for name, recipe in recipes.items():
        ppls, times, stages = [], [], []
        for s in range(seeds):
            t0 = time.time()
            student = calibrate(teacher, 'train', keep='uniform:0.25', init=replace(recipe, **overrides), tokenizer=tok, seed=s, progress=False)
            times.append(time.time() - t0)
            ppls.append(perplexity(student, test_ids, progress=False))
            rep = student.calibration_report
            stages.append(rep.timings)
            lf = rep.layers_frame()
        out['runs'][name] = dict(ppl=ppls, ppl_mean=statistics.mean(ppls), ppl_std=statistics.pstdev(ppls),
                                 calibrate_s=times, timings_seed0=stages[0], layers_seed0=lf.to_dict('records'))
        print(f'{name:32} ppl {statistics.mean(ppls):12.2f} +- {statistics.pstdev(ppls):8.2f}  calibrate {statistics.median(times):6.1f}s', flush=True)
    r = out['runs']
    if 'naive' in r and 'taylor' in r: out['naive_over_taylor'] = r['naive']['ppl_mean'] / r['taylor']['ppl_mean']
    if 'phase2' in r and 'taylor' in r: out['phase2_over_taylor'] = r['phase2']['ppl_mean'] / r['taylor']['ppl_mean']
    if 'taylor+' in r and 'taylor' in r: out['taylor_over_taylor_plus'] = r['taylor']['ppl_mean'] / r['taylor+']['ppl_mean']
    return out

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--quick', action='store_true', help='tiny budgets, 1 seed, 4k eval tokens, no ablation')
    p.add_argument('--seeds', type=int, default=3)
    p.add_argument('--out', default=None)
    a = p.parse_args()
    torch.set_num_threads(2); torch.set_flush_denormal(True)
    inits = ['naive', 'zero_gate', 'phase1', 'phase2', 'taylor', 'taylor+']
    if a.quick: res = run(inits, 1, 4096, dict(steps=5, calib_tokens=1024, heldout_tokens=512), ablate=False)
    else: res = run(inits, a.seeds, None, {}, ablate=True)
    out = a.out or (None if a.quick else str(Path(__file__).parent/'results'/'calibrate.json'))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(res, indent=1, default=float)); print('wrote', out)
