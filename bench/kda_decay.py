"""What a decay per key channel buys, layer by layer: each converted layer of a teacher (25% kept, uniform) initialised
by Phase 1 three ways and compared with the teacher's attention output on held-out windows:

- `gdn`: a GDN layer, one half-life per head, $d_h$ (the paper's mapping);
- `gdn, constant gate`: the same with Phase 1's output gate constant per head (the recipe switch `constant_gate`);
- `kda, d_h per channel`: a KDA layer whose every key channel gets its head's $d_h$ (the GDN mapping on KDA);
- `kda, d_h,p per channel`: a KDA layer whose channels get the distance of their rotary pair, $d_{h,p}$
  (12_kda_calibrate), the head's $d_h$ where that is undefined;
- `kda, d_h,p rescaled to d_h`: the same pair distances, each head's multiplied by one factor so that their geometric
  mean is the head's $d_h$ (the order and spread across pairs kept, the head's timescale $d_h$'s).

Phase 1 is the exact variant (`exact_decay`, `exact_beta`) with the value scale fitted on what the layer emits
(`acting_scale`), so the output amplitude is a least-squares fit and the comparison is of the recurrence's shape; no
Phase 2, no gauge. Calibration on the first TRAIN windows, the held-out windows after them (as `calibrate` takes them);
the metrics are the held-out cosine and the MSE relative to the teacher output's mean square (0: exact; 1: as far as
emitting nothing).

Run: `python bench/kda_decay.py --teacher smollm2-135m` (a few minutes on one thread; writes
bench/results/kda_decay_<teacher>.json).
"""
import argparse, copy, json, statistics, time
from dataclasses import replace
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]
ARMS = ('gdn', 'gdn, constant gate', 'kda, d_h per channel', 'kda, d_h,p per channel', 'kda, d_h,p rescaled to d_h')

def pair_distances_of(arm, st, l):
    "The pair distances an arm hands Phase 1 (NaN: the channel takes its head's d_h)."
    pd, d_h = st.pair_distance[l], st.mean_distance[l]
    if arm == 'kda, d_h,p per channel': return pd
    if arm == 'kda, d_h,p rescaled to d_h':            # each head's pairs keep their order and spread, their geometric mean is d_h
        return pd * (d_h / pd.log().nanmean(-1).exp())[:, None]
    return torch.full_like(pd, float('nan'))

def main(a):
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.core import get_recipe, phase1, layer_fit, token_windows
    from taylor_calibrate.convert import to_hybrid, gdn_modules, resolve_keep
    from taylor_calibrate.windows import layer_captures
    torch.set_num_threads(a.threads)
    teacher, tok = load_teacher(a.teacher)
    recipe = replace(get_recipe('taylor+'), acting_scale=True, phase2=False, gauge_fix=False)
    w = token_windows('train', tok, a.seq_len, max_tokens=(a.calib_windows + a.heldout_windows) * a.seq_len)
    cal, held = w[:a.calib_windows], w[a.calib_windows:a.calib_windows + a.heldout_windows]
    L = teacher.config.num_hidden_layers
    kept = resolve_keep('uniform:0.25', L)
    hybrids = {m: gdn_modules(to_hybrid(teacher, kept, share_weights=True, mixer=m)) for m in ('gdn', 'kda')}
    conv = sorted(hybrids['gdn'])
    timings = dict(statistics_s=0.)
    rows, t0 = [], time.time()
    for l, st, (cap, cmask), (hcap, hmask) in layer_captures(teacher, cal, held, conv, timings, pair_lags=True):
        x, ctx, m = cap['input'], cap['context'], cmask
        heldout = (hcap['input'], hcap['output'], hmask)
        stats = dict(mean_distance=st.mean_distance[l], entropy=st.entropy[l], rel_entropy=st.rel_entropy[l])
        row = dict(layer=l, undefined_pairs=float(st.pair_distance[l].isnan().float().mean()),
                   mean_distance=st.mean_distance[l].tolist(), pair_distance=[[None if v != v else v for v in h] for h in st.pair_distance[l].tolist()])
        for arm in ARMS:
            layer = copy.deepcopy(hybrids[arm[:3]][l]).float()   # each arm from the same copy (Phase 1 scales o_proj in place)
            phase1(layer, dict(stats, pair_distance=pair_distances_of(arm, st, l)), x, ctx, m, replace(recipe, constant_gate=arm == 'gdn, constant gate'))
            fit = layer_fit(layer, *heldout)
            target_ms = float(heldout[1][heldout[2].bool()].double().pow(2).mean())
            row[arm] = dict(cos=fit['cos'], rel_mse=fit['mse'] / target_ms)
        rows.append(row)
        print(l, {k: (round(row[k]['cos'], 3), round(row[k]['rel_mse'], 3)) for k in ARMS}, flush=True)
    summary = {arm: dict(median_cos=statistics.median(r[arm]['cos'] for r in rows), median_rel_mse=statistics.median(r[arm]['rel_mse'] for r in rows),
                         layers_best=sum(max(ARMS, key=lambda k: r[k]['cos']) == arm for r in rows)) for arm in ARMS}
    out = dict(teacher=a.teacher or 'tiny-qwen2', kept=kept, converted=conv, calib_tokens=cal.numel(), heldout_tokens=held.numel(),
               recipe='taylor+ Phase 1 with acting_scale, no gauge, no Phase 2', threads=a.threads, seconds=time.time() - t0,
               layers=rows, summary=summary)
    path = ROOT/'bench'/'results'/f"kda_decay_{a.teacher or 'tiny-qwen2'}.json"
    path.write_text(json.dumps(out, indent=1)); print(json.dumps(summary, indent=1)); print('wrote', path)

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--teacher', default=None, help='a teacher name load_teacher takes (default: tiny-qwen2)')
    p.add_argument('--calib-windows', type=int, default=4)
    p.add_argument('--heldout-windows', type=int, default=2)
    p.add_argument('--seq-len', type=int, default=512)
    p.add_argument('--threads', type=int, default=1)
    main(p.parse_args())
