"""Does the balanced gauge slow Phase 2 down, and is that all it does? One test on SmolLM2-135M.

The balanced gauge (`Recipe.gauge_fix`) converts the teacher at W_V / ρ, ρ W_O (per KV head, ρ < 1 on SmolLM2): the same
function, so Phase 1 ends at the same layer output with or without it. An AdamW step is the same size in parameter units
whatever a parameter's scale, and the layer's output depends on W_V / ρ through ρ times smaller a slope, so with the gauge
each W_V step moves the output ρ times less. If that is the whole difference, the gauge with W_V's learning rate divided
by ρ should follow the run without the gauge, and both should end lower than the gauge at the recipe's rate.

This runs `taylor+` four ways on a few of the layers the uniform 25% policy converts: with the gauge (the recipe), without
it, and with it and the learning rate divided by the layer's ρ (the geometric mean over its heads; one rate per
parameter tensor) for W_V alone, then for W_V and the output gate's g_proj, which Phase 1 sets to alpha* W_V and which
feeds the ρ-times smaller o_proj. Phase 2 aligns each layer to the teacher's output on the teacher's own inputs, so a layer's
curve does not depend on which other layers are converted: the first two variants reproduce those layers of the
ledger's `taylor+` and `taylor+ without gauge_fix` runs (checked below against their reports).

    .venv/bin/python scripts/gauge_rate.py      # about 40 minutes on one thread; variants already in the file are kept -> bench/results/gauge_rate_smollm2-135m.json

Calibration on the first TRAIN windows, as calibrate takes them; nothing here reads VALID or TEST.
"""
import json, time
from dataclasses import replace
from pathlib import Path
import torch
from taylor_calibrate import core
from taylor_calibrate.core import RECIPES, balanced_gauge, calibrate
from taylor_calibrate.teacher import load_teacher

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT/'bench'/'results'/'gauge_rate_smollm2-135m.json'
REPORTS = ROOT/'bench'/'results'/'experiments_smollm2-135m'/'reports'
LAYERS = (1, 13, 29)          # converted by uniform:0.25 on 30 layers (kept 0, 3, 7, 11, 15, 18, 22, 26): first, middle, last
_groups = core._param_groups

def rates_divided_by(k_of_layer: dict, names: tuple):
    "Phase 2's parameter groups with the weights of `names` in groups of their own, at their group's rate / ρ of the layer (`k_of_layer`)."
    def groups(gdn, recipe):
        out = []
        for g in _groups(gdn, recipe):
            mine = [p for n, p in gdn.named_parameters() if n.startswith(names) and any(p is q for q in g['params'])]
            rest = [p for p in g['params'] if all(p is not q for q in mine)]
            out += [dict(g, params=rest)] + ([dict(g, params=mine, lr=g['lr'] / k_of_layer[gdn.layer_idx])] if mine else [])
        return out
    return groups

def run(teacher, tok, recipe, groups=None):
    core._param_groups = groups or _groups
    try:
        keep = [l for l in range(teacher.config.num_hidden_layers) if l not in LAYERS]
        t0 = time.time()
        rep = calibrate(teacher, 'train', keep=keep, init=recipe, tokenizer=tok, progress=False).calibration_report
    finally:
        core._param_groups = _groups
    layers = {r['layer']: r for r in rep.layers}
    return dict(seconds=round(time.time() - t0, 1),
                layers={str(l): dict(mse_phase1=layers[l]['mse_phase1'], mse_phase2=layers[l]['mse_phase2'],
                                best_step=layers[l]['phase2_best_step'], stopped=layers[l]['phase2_stopped'],
                                heldout_step=rep.curves[l]['heldout_step'], heldout=rep.curves[l]['heldout'])
                        for l in LAYERS})

def ledger_report(init: str) -> dict:
    "The layer rows of the ledger's seed-0 uniform:0.25 run of `init` (`taylor+`, or an ablation's name)."
    import gzip, hashlib
    key = f'init={init}|keep=uniform:0.25|kind=zero_shot|kv_copy=heads|seed=0'
    with gzip.open(REPORTS/f'{hashlib.sha1(key.encode()).hexdigest()}.json.gz', 'rt') as f:
        return {r['layer']: r for r in core.CalibrationReport.from_json(f.read()).layers}

def main():
    torch.set_num_threads(1)
    teacher, tok = load_teacher('smollm2-135m')
    gauge = balanced_gauge(teacher).double()
    k = {l: float(gauge[l].log().mean().exp()) for l in LAYERS}
    base = RECIPES['taylor+']
    variants = {'with the gauge': (base, None),
                'without the gauge': (replace(base, gauge_fix=False), None),
                "with the gauge, W_V's rate / ρ": (base, rates_divided_by(k, ('v_proj',))),
                "with the gauge, W_V's and g_proj's rates / ρ": (base, rates_divided_by(k, ('v_proj', 'g_proj')))}
    done = json.loads(OUT.read_text())['variants'] if OUT.exists() else {}      # variants already run are kept, not rerun
    out = dict(teacher='smollm2-135m', recipe='taylor+', layers=list(LAYERS),
               k={l: dict(mean=k[l], heads=[round(float(x), 4) for x in gauge[l]]) for l in LAYERS}, variants={})
    for name, (recipe, groups) in variants.items():
        out['variants'][name] = done.get(name) or run(teacher, tok, recipe, groups)
        OUT.write_text(json.dumps(out, indent=1) + '\n')
        print(name, {l: f"{v['mse_phase2']:.4g}" for l, v in out['variants'][name]['layers'].items()}, flush=True)
    out['ledger_agrees'] = {}
    for name, init in (('with the gauge', 'taylor+'), ('without the gauge', 'taylor+ without gauge_fix')):
        try: led = ledger_report(init)
        except FileNotFoundError: continue
        out['ledger_agrees'][name] = max(abs(out['variants'][name]['layers'][str(l)]['mse_phase2'] / led[l]['mse_phase2'] - 1) for l in LAYERS)
    OUT.write_text(json.dumps(out, indent=1) + '\n')
    print('wrote', OUT.relative_to(ROOT), 'ledger agreement (largest relative difference):', out['ledger_agrees'])

if __name__ == '__main__': main()
