"""Where retrieval breaks: each layer of a teacher converted alone, by Phase 1 by least squares, and a continuous retrieval
score, the mean log-probability of the answer tokens on synthetic retrieval prompts (and the share answered exactly).

    python scripts/retrieval_breakage.py --teacher smollm2-135m    # -> bench/results/retrieval_breakage_smollm2-135m.json

Phase 1 fits each converted layer against the teacher's own inputs, so one `calibrate` call that converts every layer but
one (and a second for that one) gives every layer's fitted state; any set of converted layers is then assembled from those
states with no further calibration, and scoring a set costs forward passes only; the `needle` layer policy is this map (`taylor_calibrate.policies`).
The prompts are that policy's and share nothing with the long-context probes of `taylor_calibrate.probes`: other needle sentences and questions, keys of digits
or letters, and filler from the VALID split of the shipped corpus or generated sentences (calibration reads TRAIN; the
probes use their own filler). `--sets` scores kept sets too (retrieval score and VALID perplexity).
"""
import argparse, json, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]

def retrieval_prompts(tok, n: int = 8, length: int = 1536, seed: int = 0) -> list:
    "(prompt ids, answer ids) pairs: the needle policy's prompts (`policies.needle_prompts`), filler from 200,000 VALID tokens."
    from taylor_calibrate.teacher import corpus_token_ids
    from taylor_calibrate.policies import needle_prompts
    return needle_prompts(tok, corpus_token_ids(tok, 'valid', 200_000), n, length, seed)

def retrieval_score(model, prompts) -> dict:
    "Mean over prompts of the answer tokens' mean log-probability (teacher-forced), and the share whose answer is the greedy one."
    from taylor_calibrate.policies import answer_logprob
    return answer_logprob(model, prompts)

def fitted_states(teacher, tok, checkpoints: Path | None) -> dict:
    "Every layer's GDN state after Phase 1 by least squares, teacher-forced: two calibrate calls (every layer but 0, then layer 0)."
    from taylor_calibrate.core import calibrate
    from taylor_calibrate.convert import gdn_modules
    n, states = teacher.config.num_hidden_layers, {}
    for name, kept in (('keep_0', [0]), ('convert_0', list(range(1, n)))):
        ck = checkpoints/name if checkpoints else None
        s = calibrate(teacher, 'train', keep=kept, init='phase1', tokenizer=tok, checkpoint_dir=ck)
        for l, g in gdn_modules(s).items(): states.setdefault(l, {k: v.clone() for k, v in g.state_dict().items()})
    return states

def hybrid_with(teacher, states: dict, converted) -> torch.nn.Module:
    "The teacher with the `converted` layers as their fitted GDN layers, the rest attention (a new hybrid sharing the teacher's weights)."
    from taylor_calibrate.convert import to_hybrid, gdn_modules
    n = teacher.config.num_hidden_layers
    h = to_hybrid(teacher, [l for l in range(n) if l not in set(converted)], seed=0, share_weights=True)
    for l, g in gdn_modules(h).items(): g.load_state_dict(states[l])
    return h.eval()

def main(a):
    from taylor_calibrate.teacher import load_teacher, perplexity, corpus_token_ids
    torch.set_num_threads(a.threads)
    teacher, tok = load_teacher(a.teacher)
    n = teacher.config.num_hidden_layers
    t0 = time.time()
    states = fitted_states(teacher, tok, Path(a.checkpoints) if a.checkpoints else None)
    fit_s = time.time() - t0
    prompts = retrieval_prompts(tok, a.prompts, a.length)
    out = dict(teacher_name=a.teacher, prompts=a.prompts, length=a.length, fit_seconds=fit_s, teacher=retrieval_score(teacher, prompts), layers={})
    print('teacher', out['teacher'], flush=True)
    for l in range(n):
        out['layers'][l] = retrieval_score(hybrid_with(teacher, states, [l]), prompts)
        print(f"layer {l:2d} converted alone: answer log-probability {out['layers'][l]['logprob']:.3f}, exact {out['layers'][l]['exact']:.2f}", flush=True)
    if a.sets:
        valid = corpus_token_ids(tok, 'valid', a.valid_tokens)
        out['teacher_valid_ppl'] = perplexity(teacher, valid)
        out['sets'] = {}
        for kept in a.sets.split(';'):
            keep = [int(x) for x in kept.split(',')]
            h = hybrid_with(teacher, states, [l for l in range(n) if l not in keep])
            out['sets'][kept] = dict(**retrieval_score(h, prompts), valid_ppl=perplexity(h, valid))
            print('kept', kept, out['sets'][kept], flush=True)
    out['seconds'] = time.time() - t0
    path = ROOT/'bench'/'results'/f'retrieval_breakage_{a.teacher}.json'
    path.write_text(json.dumps(out, indent=1)); print('wrote', path)

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--teacher', default='smollm2-135m')
    p.add_argument('--prompts', type=int, default=8)
    p.add_argument('--length', type=int, default=1536, help='prompt length in tokens')
    p.add_argument('--sets', default='0,3,7,11,15,18,22,26;0,1,2,16,20,23,24,28;0,1,2,16,17,18,23,24',
                   help="kept sets to score, ';'-separated (default: uniform, AR's and the critical layers' at 8 of 30)")
    p.add_argument('--valid-tokens', type=int, default=8192)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--checkpoints', default=None, help='keep the fitted layers here, so that a killed run resumes')
    main(p.parse_args())
