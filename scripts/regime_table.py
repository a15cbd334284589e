"""The regime diagnostic of a teacher (`taylor-calibrate diagnose`), kept as JSON for the results notebook: per converted
layer, the teacher's context, attention output and residual RMS, and each init's GDN branch against the teacher's
attention output (RMS ratio and cosine) on held-out VALID tokens; calibration reads TRAIN.

    python scripts/regime_table.py --teacher smollm2-135m     # -> bench/results/regime_smollm2-135m.json (about a minute)
"""
import argparse, json, platform, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]

def main(a):
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.regime import regime_table, naive_verdict
    torch.set_num_threads(a.threads)
    teacher, tok = load_teacher(a.teacher)
    t0 = time.time()
    table = regime_table(teacher, 'train', keep=a.keep, tokenizer=tok, inits=a.inits.split(','), heldout='valid', heldout_tokens=a.heldout_tokens)
    out = dict(teacher=a.teacher, keep=a.keep, calib_split='train', heldout_split='valid', heldout_tokens=a.heldout_tokens, inits=a.inits.split(','),
               verdict={i: naive_verdict(table, i) for i in a.inits.split(',')}, rows=table.to_dict('records'), seconds=time.time() - t0,
               torch=torch.__version__, machine=platform.processor() or platform.machine())
    path = Path(a.out or ROOT/'bench'/'results'/f'regime_{a.teacher}.json')
    path.write_text(json.dumps(out, indent=1, default=float))
    print(table.to_string(index=False, float_format=lambda v: f'{v:.4g}')); print(out['verdict']['naive']); print('wrote', path)

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--teacher', default='smollm2-135m')
    p.add_argument('--keep', default='uniform:0.25')
    p.add_argument('--inits', default='naive,taylor_phase1')
    p.add_argument('--heldout-tokens', type=int, default=2048)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--out', default=None, help='default: bench/results/regime_<teacher>.json')
    main(p.parse_args())
