"""Does a longer fit or Phase 2 bring retrieval back to the breakage map's kept set? The set of
`scripts/retrieval_breakage.py` (layers 0-2 with the critical 16-18, 23 and 24: 8 of 30 kept) calibrated several ways,
each scored by that script's retrieval score (answer log-probability on its own prompts, VALID filler), VALID
perplexity and the passkey probe of `taylor_calibrate.probes` at 1K, 2K and 4K tokens (5 depths each).

    python scripts/retrieval_fits.py --checkpoints DIR    # -> bench/results/retrieval_fits_smollm2-135m.json

`--kept` calibrates other kept sets the same ways (what retrieval takes: more layers kept, in the breakage map's order).
Fits: `phase1_512` (Phase 1 by least squares on 512-token windows, the fits of retrieval_breakage.py, read from
`--breakage-checkpoints` when given), `phase1_2048` (the same on 2,048-token windows: the converted layers see
positions as far out as the probes' questions), `taylor+_512` (Phase 1, then 100 Phase-2 steps). Calibration reads
TRAIN; the retrieval prompts VALID; the probes use their own filler. Each finished model is one entry of the JSON: an
interrupted run resumes.
"""
import argparse, json, sys, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/'scripts'))
from retrieval_breakage import retrieval_prompts, retrieval_score, fitted_states, hybrid_with

KEPT = [0, 1, 2, 16, 17, 18, 23, 24]
CONTEXTS = (1024, 2048, 4096)

def passkey_found(rows) -> dict:
    "Passkeys found per context length asked for (the prompts' lengths land within a few tokens of it)."
    return {L: sum(r['correct'] for r in rows if round(r['context_len'] / 512) * 512 == L) for L in CONTEXTS}

def measure(model, tok, prompts, valid, items) -> dict:
    from taylor_calibrate.teacher import perplexity
    from taylor_calibrate.probes import run_probes
    t0 = time.time()
    rows = run_probes(model, tok, items, progress=False)
    return dict(**retrieval_score(model, prompts), valid_ppl=perplexity(model, valid, progress=False), passkey=passkey_found(rows),
                passkey_rows=[dict(context_len=r['context_len'], depth=r['depth'], answer=r['answer'], continuation=r['continuation'],
                                   correct=r['correct']) for r in rows], measure_s=time.time() - t0)

def entry_name(name: str, kept: list) -> str:
    "A result's name: the fit's, with the kept set appended where it is not `KEPT`."
    return name if kept == KEPT else f"{name} keep={','.join(map(str, kept))}"

def model_of(name, kept, teacher, tok, a):
    "The teacher, or `kept` calibrated as `name` ('phase1_512': the breakage fits; '<init>_<window>': calibrate)."
    from taylor_calibrate.core import calibrate
    if name == 'teacher': return teacher
    n = teacher.config.num_hidden_layers
    if name == 'phase1_512':
        states = fitted_states(teacher, tok, Path(a.breakage_checkpoints) if a.breakage_checkpoints else None)
        return hybrid_with(teacher, states, [l for l in range(n) if l not in kept])
    init, window = name.rsplit('_', 1)
    return calibrate(teacher, 'train', keep=kept, init=init, tokenizer=tok, seq_len=int(window), progress=False,
                     checkpoint_dir=Path(a.checkpoints)/entry_name(name, kept).replace(' ', '_') if a.checkpoints else None)

def main(a):
    from taylor_calibrate.teacher import load_teacher, corpus_token_ids
    from taylor_calibrate.probes import probe_items
    torch.set_num_threads(a.threads); torch.set_flush_denormal(True)
    out_path = Path(a.out) if a.out else ROOT/'bench'/'results'/f'retrieval_fits_{a.teacher}.json'
    res = json.loads(out_path.read_text()) if out_path.exists() else {}
    teacher, tok = load_teacher(a.teacher)
    prompts, valid = retrieval_prompts(tok, 8, 1536), corpus_token_ids(tok, 'valid', 8192)
    items = probe_items(tok, kinds=('passkey',), context_lens=CONTEXTS)
    for kept in ([sorted(int(x) for x in k.split(',')) for k in a.kept.split(';')] if a.kept else [KEPT]):
        for name in a.models.split(','):
            e = 'teacher' if name == 'teacher' else entry_name(name, kept)
            if e not in res:
                t0 = time.time()
                model = model_of(name, kept, teacher, tok, a)
                res[e] = dict(fit_s=time.time() - t0, **measure(model, tok, prompts, valid, items))
            res[e]['passkey'] = passkey_found(res[e]['passkey_rows'])
            out_path.write_text(json.dumps(dict(res, kept=KEPT), indent=1))
            print(e, {k: v for k, v in res[e].items() if k != 'passkey_rows'}, flush=True)

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--teacher', default='smollm2-135m')
    p.add_argument('--models', default='teacher,phase1_512,phase1_2048,taylor+_512')
    p.add_argument('--kept', default=None, help="kept sets, ';'-separated (default: the breakage map's 8 of 30); an entry of a set "
                   "other than the default is named '<fit> keep=<layers>'")
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--checkpoints', default=None, help='keep each calibration\'s layers here, so that a killed run resumes')
    p.add_argument('--breakage-checkpoints', default=None, help="retrieval_breakage.py's --checkpoints (its fits, fitted again where missing)")
    p.add_argument('--out', default=None, help='default: bench/results/retrieval_fits_<teacher>.json')
    main(p.parse_args())
