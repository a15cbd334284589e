"""The paper's experiments at small scale on the shipped teacher (issue 9): zero-shot grid, retention sweep,
recovery distillation, and the GQA-copy ablation. Calibration on TRAIN, layer selection on VALID, evaluation on TEST.

    python scripts/experiments.py --mini --out /tmp/exp.json     # a few steps of everything (CI smoke run)
    python scripts/experiments.py                                # the full run -> bench/results/experiments.json
    python scripts/experiments.py --parts grid,gqa --seeds 1     # a subset

Recovery budget: `--recovery-tokens` per init (the same for every init); validation perplexity on VALID.
"""
import argparse, json, math, statistics, time
from pathlib import Path
import torch
from taylor_calibrate.teacher import load_teacher, perplexity, corpus_token_ids
from taylor_calibrate.core import calibrate, token_windows
from taylor_calibrate.distill import distill, tokens_to_reach

INITS = ('naive', 'zero_gate', 'phase1', 'phase2', 'taylor', 'taylor+')

def _summ(xs): return dict(values=xs, mean=statistics.mean(xs), std=statistics.pstdev(xs))

def zero_shot(teacher, tok, test_ids, keep, init, seeds, budget):
    ppls = []
    for s in range(seeds):
        student = calibrate(teacher, 'train', keep=keep, init=init, tokenizer=tok, seed=s, progress=False, **budget)
        ppls.append(perplexity(student, test_ids, progress=False))
    return dict(**_summ(ppls), kept=student.calibration_report.keep)

def grid(teacher, tok, test_ids, seeds, budget, policies=('uniform:0.25', 'ar:0.25', 'ga-s2:0.25')):
    out = {}
    for pol in policies:
        for init in INITS:
            t0 = time.time(); out[f'{pol}|{init}'] = r = zero_shot(teacher, tok, test_ids, pol, init, seeds, budget)
            print(f'grid {pol:12} {init:10} ppl {r["mean"]:10.2f} +- {r["std"]:7.2f} kept {r["kept"]} ({time.time()-t0:.0f}s)', flush=True)
    return out

def retention(teacher, tok, test_ids, seeds, budget):
    out = {}
    for frac in (0.25, 0.5, 0.75):
        for init in ('naive', 'taylor', 'taylor+'):
            out[f'uniform:{frac}|{init}'] = r = zero_shot(teacher, tok, test_ids, f'uniform:{frac}', init, seeds, budget)
            print(f'retention {frac} {init:8} ppl {r["mean"]:10.2f}', flush=True)
    return out

def gqa(teacher, tok, test_ids, seeds, budget):
    out = {}
    for kv in ('heads', 'rows_bug'):
        out[kv] = r = zero_shot_kv(teacher, tok, test_ids, kv, seeds, budget)
        print(f'gqa {kv:9} ppl {r["mean"]:10.2f}', flush=True)
    return out

def zero_shot_kv(teacher, tok, test_ids, kv_copy, seeds, budget):
    ppls = [perplexity(calibrate(teacher, 'train', keep='uniform:0.25', init='taylor', tokenizer=tok, seed=s, progress=False,
                                 gdn_options=dict(kv_copy=kv_copy), **budget), test_ids, progress=False) for s in range(seeds)]
    return _summ(ppls)

def recovery(teacher, tok, teacher_ppl_valid, valid_ids, tokens, budget, seq_len, batch_size):
    train = token_windows('train', tok, seq_len, max_tokens=tokens + 64 * seq_len)[64:]   # past the first windows calibration reads most
    out = {}
    for init in ('naive', 'zero_gate', 'taylor', 'taylor+'):
        t0 = time.time()
        student = calibrate(teacher, 'train', keep='uniform:0.25', init=init, tokenizer=tok, progress=False, **budget)
        log = distill(student, teacher, train, tokens=tokens, seq_len=seq_len, batch_size=batch_size, eval_data=valid_ids,
                      eval_tokens=valid_ids.numel(), progress=False)
        out[init] = json.loads(log.to_json())
        print(f'recovery {init:9} valid ppl {log.eval_ppl[0]:10.2f} -> {log.eval_ppl[-1]:8.2f} ({time.time()-t0:.0f}s)', flush=True)
    targets = {f'{m}x teacher': m * teacher_ppl_valid for m in (1.25, 1.5, 2.0)}
    if 'naive' in out: targets['naive final'] = out['naive']['eval_ppl'][-1]
    reach = {}
    from taylor_calibrate.distill import DistillLog
    for init, j in out.items():
        log = DistillLog.from_json(json.dumps(j))
        reach[init] = {t: tokens_to_reach(log, v) for t, v in targets.items()}
    ratios = {}
    for t in targets:
        n, c = reach['naive'][t], reach['taylor'][t]
        ratios[t] = None if n is None or c is None or not c[0] else dict(ratio=n[0] / c[0], naive_upper_bound=n[1], taylor_upper_bound=c[1])
    return dict(logs=out, targets=targets, tokens_to_reach=reach, naive_over_taylor=ratios, teacher_valid_ppl=teacher_ppl_valid)

def main(a):
    torch.set_num_threads(a.threads); torch.set_flush_denormal(True)
    teacher, tok = load_teacher()
    test_ids = corpus_token_ids(tok, 'test', a.eval_tokens)
    valid_ids = corpus_token_ids(tok, 'valid', a.valid_tokens)
    budget = dict(steps=3, calib_tokens=1024, heldout_tokens=512) if a.mini else {}
    res = dict(setup=dict(eval_split='test', eval_tokens=test_ids.numel(), selection_split='valid', calib_split='train',
                          seeds=a.seeds, mini=a.mini, budget=budget, recovery_tokens=a.recovery_tokens),
               teacher_test_ppl=perplexity(teacher, test_ids, progress=False))
    parts = a.parts.split(',')
    if 'grid' in parts: res['grid'] = grid(teacher, tok, test_ids, a.seeds, budget, ('uniform:0.25',) if a.mini else ('uniform:0.25', 'ar:0.25', 'ga-s2:0.25'))
    if 'retention' in parts: res['retention'] = retention(teacher, tok, test_ids, a.seeds, budget)
    if 'gqa' in parts: res['gqa'] = gqa(teacher, tok, test_ids, a.seeds, budget)
    if 'recovery' in parts:
        res['recovery'] = recovery(teacher, tok, perplexity(teacher, valid_ids, progress=False), valid_ids, a.recovery_tokens,
                                   budget, a.seq_len, a.batch_size)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1, default=float)); print('wrote', a.out)
    return res

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--mini', action='store_true', help='tiny budgets everywhere: checks the code path, measures nothing')
    p.add_argument('--parts', default='grid,retention,gqa,recovery')
    p.add_argument('--seeds', type=int, default=3)
    p.add_argument('--eval-tokens', type=int, default=None)
    p.add_argument('--valid-tokens', type=int, default=16384)
    p.add_argument('--recovery-tokens', type=int, default=262144)
    p.add_argument('--seq-len', type=int, default=512)
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--out', default=str(Path(__file__).resolve().parents[1]/'bench'/'results'/'experiments.json'))
    a = p.parse_args()
    if a.mini: a.seeds, a.eval_tokens, a.valid_tokens, a.recovery_tokens, a.seq_len, a.batch_size = 1, 2048, 1024, 1024, 256, 2
    main(a)
