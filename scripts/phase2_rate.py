"""Is Phase 2's budget or its learning rate what stops it? One test on SmolLM2-135M.

On SmolLM2-135M `taylor+` with Phase 2 capped at 1,000 steps instead of 300 ends about twice the teacher, against 2.8
times, and every layer's held-out loss is still falling at its last step (08, the budget row of the ablation): Phase 2 is
stopped by its budget. The same distance in fewer steps means larger steps. This runs `taylor+` with both of Phase 2's
learning rates (W_Q/W_K/W_V/W_O's and the gates') multiplied by a few factors on the layers `scripts/gauge_rate.py`
takes (first, middle and last of those the uniform 25% policy converts), and sets each layer's held-out loss beside the
recipe's (the first variant of `bench/results/gauge_rate_smollm2-135m.json`, the same layers and recipe) and beside
1,000 steps at the recipe's rates (the ledger's `taylor+ with steps=1000` run).

    .venv/bin/python scripts/phase2_rate.py      # about 10 minutes per factor on one thread; factors already in the file are kept -> bench/results/phase2_rate_smollm2-135m.json

Held-out loss is Phase 2's own: mean squared error to the teacher layer's output on held-out TRAIN windows. Nothing
here reads VALID or TEST, so a factor chosen here may then be measured on them.
"""
import json
from pathlib import Path
import torch
from taylor_calibrate.core import RECIPES
from taylor_calibrate.teacher import load_teacher
from experiments import recipe_of
from gauge_rate import LAYERS, OUT as GAUGE_RATE, ledger_report, run

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT/'bench'/'results'/'phase2_rate_smollm2-135m.json'
FACTORS = (2, 4, 8)

def main():
    torch.set_num_threads(1)
    teacher, tok = load_teacher('smollm2-135m')
    base = RECIPES['taylor+']
    done = json.loads(OUT.read_text())['variants'] if OUT.exists() else {}       # factors already run are kept, not rerun
    out = dict(teacher='smollm2-135m', recipe='taylor+', layers=list(LAYERS), lr_qkv=base.lr_qkv, lr_gates=base.lr_gates,
               steps=base.steps, variants={})
    out['variants']['x1'] = json.loads(GAUGE_RATE.read_text())['variants']['with the gauge']
    for f in FACTORS:
        name = f'x{f}'
        out['variants'][name] = done.get(name) or run(teacher, tok, recipe_of(f'taylor+ with rates x{f}'))
        OUT.write_text(json.dumps(out, indent=1) + '\n')
        print(name, {l: f"{v['mse_phase2']:.4g}" for l, v in out['variants'][name]['layers'].items()}, flush=True)
    try:
        led = ledger_report('taylor+ with steps=1000')
        out['steps=1000'] = {str(l): dict(mse_phase2=led[l]['mse_phase2'], best_step=led[l]['phase2_best_step']) for l in LAYERS}
    except FileNotFoundError: pass
    OUT.write_text(json.dumps(out, indent=1) + '\n')
    print('wrote', OUT.relative_to(ROOT))

if __name__ == '__main__': main()
