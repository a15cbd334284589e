"""What recovery tokens buy a quarter-kept hybrid at retrieval: the `needle:0.25` hybrid of `taylor-calibrate convert`
distilled in stages on 2,048-token TRAIN windows, half of them plain text and half retrieval-bearing (three keys hidden
in the text at random depths, then the three questions and their answers), the passkey probe of
`taylor_calibrate.probes` at 1K, 2K and 4K tokens and VALID perplexity measured after each stage (the windows:
`taylor_calibrate.distill.with_needles`, what `taylor-calibrate distill --needles 0.5` trains on).

    python scripts/retrieval_recovery.py --hybrid DIR/model --checkpoints CKPT --save OUT   # -> bench/results/retrieval_recovery_smollm2-135m.json
    python scripts/retrieval_recovery.py --hybrid DIR/model --checkpoints CKPT --plain --stages 2   # the control

The retrieval-bearing windows use needles, questions and keys of their own (`RECOVERY_NEEDLES`: none of the probes'
pass key, none of the `needle` policy's prompts) over TRAIN filler; the probes bring their own filler. `--plain` trains on
plain TRAIN windows only (the control: what the same tokens buy without retrieval-bearing text). Each stage is
`taylor_calibrate.distill.distill` with the package's defaults (forward KL, AdamW at 1e-4 on the mixers and 7e-6
elsewhere) on its own slice of the windows; its student is saved under `--checkpoints`, so that a killed run resumes
at the stage it stopped in.
"""
import argparse, json, sys, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/'scripts'))
from retrieval_fits import CONTEXTS, passkey_found

def training_windows(tok, n: int, seq_len: int, plain: bool, seed: int = 0) -> torch.Tensor:
    "`n` TRAIN windows, every second one retrieval-bearing (`taylor_calibrate.distill.with_needles`; none with `plain`)."
    from taylor_calibrate.teacher import corpus_token_ids
    from taylor_calibrate.distill import with_needles
    return with_needles(corpus_token_ids(tok, 'train', n * seq_len).view(n, seq_len), tok, share=0 if plain else 0.5, seed=seed)

def passkeys(model, tok, items) -> dict:
    "Passkeys found per context length, and each prompt's answer, as `retrieval_fits.py` records them."
    from taylor_calibrate.probes import run_probes
    rows = run_probes(model, tok, items, progress=False)
    return dict(passkey=passkey_found(rows), passkey_rows=[dict(context_len=r['context_len'], depth=r['depth'], answer=r['answer'],
                                                                continuation=r['continuation'], correct=r['correct']) for r in rows])

def main(a):
    from taylor_calibrate.teacher import load_teacher, corpus_token_ids, perplexity
    from taylor_calibrate.hybrid import load_hybrid
    from taylor_calibrate.probes import probe_items
    from taylor_calibrate.distill import distill, RECOVERY_NEEDLES
    torch.set_num_threads(a.threads); torch.set_flush_denormal(True)
    name = ('plain' if a.plain else 'retrieval-bearing') + ('' if a.seq_len == 2048 else f' {a.seq_len}')
    out = Path(a.out) if a.out else ROOT/'bench'/'results'/f'retrieval_recovery_{a.teacher}.json'
    res = json.loads(out.read_text()) if out.exists() else {}
    runs = res.setdefault(name, [])
    teacher, tok = load_teacher(a.teacher, progress=False)
    per_stage = a.stage_tokens // a.seq_len
    windows = training_windows(tok, per_stage * a.stages, a.seq_len, a.plain)
    valid = corpus_token_ids(tok, 'valid', 8192)
    items = probe_items(tok, kinds=('passkey',), context_lens=CONTEXTS)
    ck = Path(a.checkpoints)/name.replace('-', '_').replace(' ', '_')
    student = load_hybrid(a.hybrid).eval()
    res.update(hybrid=str(a.hybrid), needles=[n for n, _ in RECOVERY_NEEDLES])
    res.setdefault('settings', {})[name] = dict(seq_len=a.seq_len, stage_tokens=a.stage_tokens, grad_accum=a.grad_accum)
    if not runs:
        t0 = time.time()
        runs.append(dict(tokens=0, valid_ppl=perplexity(student, valid, progress=False), **passkeys(student, tok, items), measure_s=time.time() - t0))
        out.write_text(json.dumps(res, indent=1))
    for s in range(1, a.stages + 1):
        saved = ck/f'stage{s}.pt'
        if len(runs) > s:
            continue
        prev = ck/f'stage{s - 1}.pt'
        if s > 1: student.load_state_dict(torch.load(prev, weights_only=True))
        if a.checkpointing: student.gradient_checkpointing_enable()    # activations recomputed in backward: 4,096-token windows in 24 GB
        t0 = time.time()
        distill(student, teacher, windows[(s - 1) * per_stage:s * per_stage], tokens=a.stage_tokens, seq_len=a.seq_len, batch_size=1,
                grad_accum=a.grad_accum, checkpoint_dir=ck/f'distill{s}', seed=s, progress=a.progress)
        train_s = time.time() - t0
        saved.parent.mkdir(parents=True, exist_ok=True); torch.save(student.state_dict(), saved)
        student.eval(); t0 = time.time()
        runs.append(dict(tokens=s * a.stage_tokens, train_s=train_s, valid_ppl=perplexity(student, valid, progress=False),
                         **passkeys(student, tok, items), measure_s=time.time() - t0))
        out.write_text(json.dumps(res, indent=1))
        print(name, {k: v for k, v in runs[-1].items() if k != 'passkey_rows'}, flush=True)
    if a.save and len(runs) > a.stages:
        from taylor_calibrate.hybrid import save_hybrid
        student.load_state_dict(torch.load(ck/f'stage{a.stages}.pt', weights_only=True))
        save_hybrid(student, a.save, tok, overwrite=True)
        print('saved', a.save)
    if len(runs) > a.stages: print('done:', [(r['tokens'], r['passkey'], round(r['valid_ppl'], 2)) for r in runs])

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--teacher', default='smollm2-135m')
    p.add_argument('--hybrid', required=True, help='a hybrid folder written by taylor-calibrate convert (its model/ folder)')
    p.add_argument('--checkpoints', required=True, help="each stage's student and distillation checkpoints")
    p.add_argument('--plain', action='store_true', help='plain TRAIN windows only (the control)')
    p.add_argument('--seq-len', type=int, default=2048)
    p.add_argument('--stage-tokens', type=int, default=32768)
    p.add_argument('--stages', type=int, default=4)
    p.add_argument('--grad-accum', type=int, default=2, help='windows per optimizer step (one per forward pass)')
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--progress', action='store_true')
    p.add_argument('--checkpointing', action='store_true', help='gradient checkpointing (less memory, more time)')
    p.add_argument('--save', default=None, help="save the last stage's student here (save_hybrid), for scripts/long_context.py --hybrids")
    p.add_argument('--out', default=None)
    main(p.parse_args())
